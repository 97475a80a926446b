"""Issue 35's gate against a real llama-server (`real_only`): with kvpersist's DEFAULT
configuration, in front of llama-server started each way users start it, no request reuses
fewer tokens through kvpersist than the same request sent to llama-server directly, and a
session that returns after a llama-server restart reuses at least 90% of its prompt.

The day, the same for both runs (a fresh llama-server each, same flags, same prompts):
  A1, B1 (A's system prompt, its own question), A2 (A1 continued), C1 (another system prompt),
  llama-server restarted, A3 (A2 continued).
Each continuation carries a fixed assistant turn, so both runs send byte-identical prompts
whatever the model answered. Reuse is what llama-server reports (kvptest.checks.reported_reuse).

Flag sets (each with `--slot-save-path`, `-c`, `-t 2`): `-np 1`; none (llama-server's defaults:
4 slots over one unified pool, an 8 GiB RAM cache, idle-slot caching); `-np 4`;
`-np 1 --cache-ram 0 --no-cache-idle-slots`; `-np 2 --no-cache-idle-slots`. kvpersist's
default, mode auto, manages `-np 1` as single-slot and lets llama-server place every request
where it has several slots (docs/design.md §23). A router (`--models-dir`) is
test_router_real.py's.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_many_slots_real.py

With -s each flag set prints its two rows of reuse, direct and through kvpersist.
"""

from __future__ import annotations

import signal
import uuid

import pytest

from kvptest.chat import chat_body, make_text
from kvptest.checks import reported_reuse
from kvptest.http_client import http_request
from kvptest.multislot_helpers import FlagsLlama, require_real_llama, start_proxy

pytestmark = pytest.mark.real_only

N_CTX = 16384
SYSTEM_TOKENS = 1500
SLACK = 0.01          # "no fewer tokens than directly", within 1%
RESTORED = 0.9        # A after the restart reuses at least this share of its prompt
TIMEOUT = 120

FLAG_SETS = {
    "np1": ["-np", "1"],
    "defaults": [],
    "np4": ["-np", "4"],
    "np1-nocache": ["-np", "1", "--cache-ram", "0", "--no-cache-idle-slots"],
    "np2-noidle": ["-np", "2", "--no-cache-idle-slots"],
}
STEPS = ("A1", "B1", "A2", "C1", "restart", "A3")
ASSISTANT = "Noted. I will keep the figures in mind and answer briefly."


def day_prompts(port: int, tag: str) -> dict[str, list[dict]]:
    """The messages of each request of the day; A and B share their system prompt."""
    shared = make_text(port, "many-slots-%s-shared" % tag, SYSTEM_TOKENS)
    other = make_text(port, "many-slots-%s-other" % tag, SYSTEM_TOKENS)

    def user(text):
        return {"role": "user", "content": text}
    a1 = [{"role": "system", "content": shared}, user("List the figures of the first paragraph.")]
    a2 = a1 + [{"role": "assistant", "content": ASSISTANT}, user("Now those of the second one.")]
    return {
        "A1": a1,
        "B1": [{"role": "system", "content": shared}, user("Give this document a title.")],
        "A2": a2,
        "C1": [{"role": "system", "content": other}, user("Summarise this in one line.")],
        "A3": a2 + [{"role": "assistant", "content": ASSISTANT}, user("And the third one?")],
    }


def send(port: int, messages: list[dict], session: str) -> tuple[int, int]:
    """(reused, prompt tokens) as llama-server reports them for one chat request."""
    r = http_request(port, "POST", "/v1/chat/completions", headers={"X-Session-Id": session},
                     body=chat_body(messages, stream=False), timeout=TIMEOUT)
    assert r.status == 200 and r.complete, (r.status, r.error, r.body[:300])
    reused = reported_reuse(r.body)
    assert reused is not None, r.body[:300]
    return reused, r.json["usage"]["prompt_tokens"]


def run_day(server: FlagsLlama, port_of, prompts: dict, sid: str) -> dict[str, tuple[int, int]]:
    """Sends the day's requests to port_of() (re-read after the restart); returns each step's
    (reused, prompt tokens)."""
    got = {}
    for step in STEPS:
        if step == "restart":
            server.stop()
            server.start()
            continue
        got[step] = send(port_of(), prompts[step], "%s-%s" % (step[0], sid))
    return got


@pytest.fixture(params=list(FLAG_SETS))
def flag_set(request, tmp_path):
    require_real_llama()
    name = request.param
    direct_server = FlagsLlama(str(tmp_path / "direct"), FLAG_SETS[name], N_CTX, name="llama-direct")
    via_server = FlagsLlama(str(tmp_path / "via"), FLAG_SETS[name], N_CTX, name="llama-via")
    yield name, direct_server, via_server
    for s in (direct_server, via_server):
        s.kill()


def test_a_day_through_kvpersist_reuses_no_less_than_llama_server_alone(flag_set, tmp_path):
    name, direct_server, via_server = flag_set
    sid = uuid.uuid4().hex[:8]

    direct_server.start()
    prompts = day_prompts(direct_server.port, sid)
    direct = run_day(direct_server, lambda: direct_server.port, prompts, sid)
    direct_server.stop()

    via_server.start()
    proxy = start_proxy(via_server.url, str(tmp_path / "state"), str(tmp_path))
    try:
        assert proxy.wait_for_log(r"kv\.backend\.ready|kv\.backend\.unsupported", 30), proxy.log_text()
        via = run_day(via_server, lambda: proxy.port, prompts, sid)
    finally:
        log = proxy.log_text()
        proxy.stop(signal.SIGKILL, timeout=5)

    rows = "".join("\n  %-3s direct %5d  through kvpersist %5d  of %5d"
                   % (s, direct[s][0], via[s][0], via[s][1]) for s in direct)
    print("\nmany slots %-11s%s" % (name, rows))
    for step in direct:
        assert via[step][0] >= direct[step][0] * (1 - SLACK) - 1, (
            "%s: %s reused %d tokens through kvpersist, %d directly%s\n%s"
            % (name, step, via[step][0], direct[step][0], rows, log[-3000:]))
    reused, tokens = via["A3"]
    assert reused >= RESTORED * tokens, (
        "%s: A after the restart reused %d of %d tokens through kvpersist%s\n%s"
        % (name, reused, tokens, rows, log[-3000:]))


# ---------------------------------------------------------------------------- Messages, managed
def messages_turn(port: int, session: str, system: str, history: list[dict], text: str) -> tuple[int, int]:
    """One /v1/messages request (llama-server ignores id_slot there); (reused, prompt tokens)
    from its usage. The history carries fixed assistant turns, so prompts do not depend on
    what the random model answered."""
    body = {"model": "m", "max_tokens": 1, "temperature": 0, "system": system,
            "messages": history + [{"role": "user", "content": text}]}
    r = http_request(port, "POST", "/v1/messages", headers={"x-claude-code-session-id": session},
                     body=body, timeout=TIMEOUT)
    assert r.status == 200 and r.complete, (r.status, r.body[:300])
    u = r.json["usage"]
    history += [{"role": "user", "content": text}, {"role": "assistant", "content": ASSISTANT}]
    return u["cache_read_input_tokens"], u["input_tokens"] + u["cache_read_input_tokens"]


def test_managed_messages_sessions_alternate_and_return_after_a_restart(tmp_path):
    """`mode: managed-slots` with `-np 2 --no-cache-idle-slots`: two /v1/messages sessions
    taking turns, which kvpersist cannot pin, each return resident or restored (>= 90% of the
    prompt their last turn left), and after a llama-server restart the first returns restored
    (docs/design.md §14, §23). Before mode auto's placed path, Messages were never saved."""
    require_real_llama()
    server = FlagsLlama(str(tmp_path / "llama"), ["-np", "2", "--no-cache-idle-slots"], N_CTX,
                        name="llama-messages")
    server.start()
    proxy = start_proxy(server.url, str(tmp_path / "state"), str(tmp_path), {"mode": "managed-slots"})
    try:
        assert proxy.wait_for_log(r"kv\.backend\.ready", 30), proxy.log_text()
        sid = uuid.uuid4().hex[:8]
        convs = {name: (make_text(server.port, "messages-%s-%s" % (name, sid), SYSTEM_TOKENS), [])
                 for name in ("M1", "M2")}
        left: dict[str, int] = {}
        for rnd in range(3):
            for name, (system, history) in convs.items():
                reused, prompt = messages_turn(proxy.port, name + sid, system, history,
                                               "Round %d: list the figures." % rnd)
                if name in left:
                    assert reused >= RESTORED * left[name], (name, rnd, reused, left[name], proxy.log_text()[-3000:])
                left[name] = prompt
        server.stop()
        server.start()
        system, history = convs["M1"]
        reused, prompt = messages_turn(proxy.port, "M1" + sid, system, history, "After the restart?")
        print("\nmanaged Messages after a restart: M1 reused %d of %d (its last turn left %d)"
              % (reused, prompt, left["M1"]))
        assert reused >= RESTORED * left["M1"], (reused, left["M1"], proxy.log_text()[-3000:])
    finally:
        proxy.stop(signal.SIGKILL, timeout=5)
        server.kill()
