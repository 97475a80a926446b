#!/usr/bin/python3
"""A fake llama-server for kvpersist's integration tests.

It models the parts of llama-server that a session-aware proxy depends on (see
docs/llama-server.md): `total_slots` slots, each holding its own token list, a request placed on
the slot its `id_slot` names or, without one, as llama-server places it (docs/llama-server.md
§4.1), prompt-prefix reuse of that slot's content (`cache_n`), slot save/restore/erase of one
slot with llama-server's response shapes and
error semantics (a failed restore clears the slot), `/props` with a per-process
random `media_marker`, SSE streaming with chunked transfer, and cancellation
when the client connection drops. On request, llama-server's RAM prompt cache and idle-slot
caching over a unified pool (docs/llama-server.md §5; kvptest.fake_prompt_cache):
`preset("defaults")` is `llama-server -m model.gguf` (4 slots over one pool, an 8 GiB cache,
idle slots copied to it and cleared); without it the fake is `-np 1 --cache-ram 0`.

Tokens are whitespace-split words. A chat prompt is rendered as
`<|role|> words... <|role|> words... <|assistant|>` (a stand-in chat template),
so a client that echoes the assistant's reply back gets full prefix reuse on
the next turn, as with a real template.

Use it in-process (FakeLlamaServer(...).start()/stop()/restart()) or as a script, from the
repository root:

    PYTHONPATH=tests /usr/bin/python3 -m kvptest.fake_llama --port 8080 --slot-save-path /tmp/slots
    PYTHONPATH=tests /usr/bin/python3 -m kvptest.fake_llama --port 8080 --preset defaults

Everything is recorded (requests, management calls, stream events with their
send times, aborted streams) under a lock, for tests to assert on.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import signal
import socket
import struct
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvptest.fake_prompt_cache import PromptCache, common_prefix

MAGIC = b"ggsq"
FILE_VERSION = 3
POLL_S = 0.02  # how often a busy handler checks whether its client went away

INFERENCE_PATHS = {
    "/v1/chat/completions", "/chat/completions",
    "/v1/completions", "/completions", "/completion",
    "/v1/embeddings", "/embeddings", "/embedding",
    "/infill", "/v1/responses", "/v1/messages", "/rerank", "/v1/rerank",
}
# The routes that honour `id_slot` (docs/llama-server.md §4); the others run where llama-server
# places them.
PINNABLE_PATHS = {
    "/v1/chat/completions", "/chat/completions",
    "/v1/completions", "/completions", "/completion",
    "/infill", "/v1/responses",
}

# llama-server without -np (docs/llama-server.md §5): this many slots over one unified KV pool
AUTO_SLOTS = 4
# What `llama-server -m model.gguf` runs with, as FakeLlamaServer keyword arguments
# (docs/llama-server.md §5; --cache-ram 8192 MiB)
PRESETS = {
    "defaults": {"total_slots": "auto", "cache_idle_slots": True, "cache_ram_bytes": 8192 << 20,
                 "slot_prompt_similarity": 0.1},
}
# The routes whose task is a completion: only those read the RAM cache when placed (§5)
COMPLETION_PATHS = PINNABLE_PATHS - {"/infill"} | {"/v1/messages"}


def preset(name: str, **overrides) -> dict:
    """FakeLlamaServer keyword arguments for a llama-server command line (PRESETS), with
    `overrides` on top: FakeLlamaServer(dir, **preset("defaults"))."""
    return {**PRESETS[name], **overrides}


def now() -> float:
    """The clock shared by the fake's records and the test client (same process)."""
    return time.monotonic()


def tokenize(text: str) -> list[str]:
    return text.split()


def content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, str):
                parts.append(p)
        return " ".join(parts)
    return str(content)


def chat_tokens(messages) -> list[str]:
    toks: list[str] = []
    for m in messages or []:
        if not isinstance(m, dict):
            continue
        toks.append("<|%s|>" % m.get("role", "user"))
        toks.extend(tokenize(content_text(m.get("content"))))
    toks.append("<|assistant|>")
    return toks


def peer_closed(sock: socket.socket) -> bool:
    """True when the peer has closed (EOF or error), without consuming data."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    if not r:
        return False
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return data == b""


def _hex(c: str) -> int:
    return int(c, 16) if c in "0123456789abcdefABCDEF" else -1


def httplib_decode_path(path: str) -> str:
    """cpp-httplib's decode_path_component (llama-server decodes every request path with it
    before routing): %XX, and the non-standard %uXXXX to UTF-8, where a UTF-16 surrogate
    (%uD800-%uDFFF) decodes to nothing. Malformed escapes stay as they are. `path` holds the
    request line's bytes as latin-1 characters (as http.server reads it); so does the result."""
    out = []
    i, n = 0, len(path)
    while i < n:
        c = path[i]
        if c == "%" and i + 1 < n:
            if path[i + 1] == "u":
                digits = path[i + 2:i + 6]
                if len(digits) == 4 and all(_hex(d) >= 0 for d in digits):
                    cp = int(digits, 16)
                    if not 0xD800 <= cp < 0xE000:
                        out.append(chr(cp).encode("utf-8").decode("latin-1"))
                    i += 6
                    continue
            else:
                digits = path[i + 1:i + 3]
                if len(digits) == 2 and all(_hex(d) >= 0 for d in digits):
                    out.append(chr(int(digits, 16)))
                    i += 3
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def httplib_split_target(target: str) -> tuple[str, str]:
    """(decoded path, raw query) the way cpp-httplib's parse_request_line splits a request
    target: the fragment dropped, the path up to the first '?' decoded. An absolute-form target
    ("http://host/x") keeps its scheme and host in the path, so no route matches it."""
    target = target.split("#", 1)[0]
    path, _, query = target.partition("?")
    return httplib_decode_path(path), query


class _ThreadingHTTPServerV6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def err_body(code: int, message: str, typ: str) -> dict:
    return {"error": {"code": code, "message": message, "type": typ}}


def validate_filename(name: str) -> bool:
    """A subset of llama.cpp's fs_validate_filename (allow_subdirs=false)."""
    if not name or len(name.encode("utf-8")) > 255:
        return False
    if any(c in name for c in ':*?"<>|/\\'):
        return False
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        return False
    if name[0] == " " or name[-1] in " .":
        return False
    if ".." in name or name == ".":
        return False
    return True


class _Aborted(Exception):
    pass


# Every FakeLlamaServer made in this process, in order: conftest.py's teardown checks the slot
# discipline of those a test made (slot_discipline_violations).
CREATED: list["FakeLlamaServer"] = []


class FakeLlamaServer:
    def __init__(self, slot_save_path: str | None = None, *, port: int = 0, host: str = "127.0.0.1",
                 total_slots: int | str = 1, n_ctx: int = 8192,
                 model_path: str = "/models/fake-model-Q8_0.gguf", build_info: str = "b1-fake0001",
                 n_predict: int = 4, event_delay: float = 0.0, prefill_delay: float = 0.0,
                 kv_bytes_per_token: int = 64, kv_unified: bool | None = None,
                 cache_idle_slots: bool = False, cache_ram_bytes: int = 0,
                 slot_prompt_similarity: float = 0.1):
        """`total_slots` "auto" is llama-server without -np: 4 slots over one unified pool
        (`kv_unified` None: unified exactly then). `cache_ram_bytes` sizes the RAM prompt cache
        (0: off, as --cache-ram 0; -1: no byte limit), `cache_idle_slots` copies every other
        idle slot to it when a task starts, and clears them in a unified pool (docs/llama-server.md
        §5). The fake's own defaults are those of `-np 1 --cache-ram 0 --no-cache-idle-slots`;
        preset("defaults") gives llama-server's."""
        CREATED.append(self)
        self.host = host
        self.port = port
        self.slot_save_path = slot_save_path
        self.slot_actions_disabled = slot_save_path is None
        self.total_slots = AUTO_SLOTS if total_slots == "auto" else total_slots
        self.kv_unified = total_slots == "auto" if kv_unified is None else kv_unified
        # --cache-idle-slots needs the RAM cache: llama-server turns it off without one
        self.cache_idle_slots = cache_idle_slots and cache_ram_bytes != 0
        self.cache_ram_bytes = cache_ram_bytes
        self.n_ctx = n_ctx
        self.model_path = model_path
        self.build_info = build_info
        self.n_predict = n_predict          # default tokens generated per request
        self.event_delay = event_delay      # seconds between SSE events
        self.prefill_delay = prefill_delay  # seconds between headers and the first event
        self.finish_reason = "length"       # OpenAI chat/completions replies: stop, length, tool_calls
        self.props_status = 200             # e.g. 503: /props answers as while the model loads
        self.slots_status = 200             # e.g. 501: GET /slots as with llama-server --no-slots
        self.models_status = 200            # e.g. 403: GET /v1/models refused (a proxy in between)
        self.sleeping = False               # sleep(): as --sleep-idle-seconds, until a request wakes it
        self.reuse_after_restore = True     # False: a hybrid/SWA model that reprocesses after a restore
        self.chat_template = "{% for m in messages %}<|{{m.role}}|> {{m.content}} {% endfor %}<|assistant|>"
        self.model_meta = {"vocab_type": 1, "n_vocab": 32000, "n_ctx_train": 16384, "n_embd": 256,
                           "n_params": 19532032, "size": 39068672, "ftype": "Q8_0"}
        self.lora = [{"id": 0, "path": "/models/fake-lora.gguf", "scale": 0.0}]  # GET/POST /lora-adapters
        # kvpersist's behaviour probe (POST /completion with n_probs): the ranked token ids
        # stand for the weights. weights_seed picks them; probe_probs False answers without
        # probabilities (a server that cannot tell); probe_flicker answers noise each time.
        self.weights_seed = 0
        self.probe_probs = True
        self.probe_flicker = False
        self.wakes = 0
        self.kv_bytes_per_token = kv_bytes_per_token
        # --slot-prompt-similarity: a request without id_slot takes the idle slot whose content
        # shares more than this fraction of its prompt (docs/llama-server.md §4.1); 0 turns that
        # choice off, and with it the RAM cache's use by a pinned request (§5)
        self.slot_prompt_similarity = slot_prompt_similarity
        self.media_marker = ""
        self.pinned_marker = None           # as LLAMA_MEDIA_MARKER: the same marker after restart()
        self.epoch = 0

        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: dict[int, socket.socket] = {}
        self._conn_seq = 0
        self._req_seq = 0
        self._stopping = threading.Event()
        self._reset_slots()

        # records
        self.requests: list[dict] = []       # every request, in arrival order
        self.management: list[dict] = []     # every POST /slots/..., with outcome
        self.violations: list[str] = []      # management calls while an inference ran
        self.connections_closed: list[dict] = []

        # fault controls (one-shot unless said otherwise)
        self._fail_save: list[tuple[int, str]] = []
        self._fail_restore: list[tuple[int, str]] = []
        self._fail_erase: list[object] = []         # fail_next_erase(): a status, or "drop"
        self._delay_restore: list[float] = []
        self._delay_save: list[float] = []
        self.management_delay = 0.0          # persistent delay for save/restore/erase
        self.management_fault = None         # None | int status | "drop" (save/restore/erase)
        self.restore_n_delta = 0             # added to the reported n_restored
        self._fail_inference: list[tuple[int, dict]] = []
        self.stream_error_after: int | None = None  # send a data: {"error"} after N events
        self.stream_kill_after: int | None = None   # drop the connection after N events
        self._crash_save: list[float] = []          # crash_next_save(): write part, then die
        self.concurrent_inference = False           # load tests: no slot lock, slot untouched
        self._inference_gate = threading.Event()    # hold_inference(): requests wait before prefill
        self._inference_gate.set()
        self._running = threading.Event()           # stall(): as SIGSTOP, nothing is answered
        self._running.set()
        # hostile replies (persistent): "props" or "save" -> raw bytes sent as the 200 body
        # instead of the JSON (test_hostile_json.py: deep nesting from llama-server's side)
        self.raw_replies: dict[str, bytes] = {}
        self.predict_route = None  # e.g. "/predict": llama-server with AIP_MODE=PREDICTION
        # as cpp-httplib's keep-alive timeout (5 s in llama-server): a connection that carries
        # no request for this long is closed, a fresh one included
        self.keep_alive_timeout: float | None = None

    # ------------------------------------------------------------------ lifecycle
    def _reset_slots(self):
        # Kept sparse (a test's total_slots may be 2**62): only slots something touched.
        self.slots: collections.defaultdict[int, list[str]] = collections.defaultdict(list)  # tokens
        # llama-server's t_last_used: when a task on the slot last ended (absent: never, -1)
        self.slot_last_used: dict[int, float] = {}
        self._restored: set[int] = set()     # slots restored since their last task
        # GET /slots' n_prompt_tokens per slot id: set by an inference on the slot and by a
        # restore, 0 after an erase; a new process knows none.
        self.slot_n: dict[int, int] = {}
        self.slot_task: dict[int, int] = {}  # GET /slots' id_task: the last request run on the slot
        # the RAM prompt cache (docs/llama-server.md §5): a new process starts with it empty
        self.ram_cache: PromptCache | None = None
        if self.cache_ram_bytes != 0:
            pool = self.n_ctx if self.kv_unified else self.n_ctx * self.total_slots
            self.ram_cache = PromptCache(self.cache_ram_bytes, pool, self.kv_bytes_per_token)
        # a slot runs one task at a time; its actions wait for it (deferred)
        self._slot_locks: dict[int, threading.Lock] = {}
        self._active: dict[int, socket.socket] = {}  # request id -> client socket

    @property
    def slot_tokens(self) -> list[str]:
        """Slot 0's tokens: the whole KV of a one-slot server."""
        return self.slots[0]

    @slot_tokens.setter
    def slot_tokens(self, tokens: list[str]):
        self.slots[0] = tokens

    def slot_index(self, id_slot: int) -> int:
        """The slot an id names: llama-server wraps ids modulo the slot count (get_slot_by_id)."""
        return id_slot % self.total_slots

    def slot_lock(self, slot: int) -> threading.Lock:
        with self._lock:
            return self._slot_locks.setdefault(slot, threading.Lock())

    def place_unpinned(self, prompt: list[str], busy: set[int]) -> int | None:
        """get_available_slot for a task without id_slot (docs/llama-server.md §4.1): among the
        slots not in `busy`, the one whose content shares the largest fraction of the prompt, if
        that fraction exceeds slot_prompt_similarity; else the least recently used: one that
        never ran a task (t_last_used -1) first, ties going to the higher id as llama-server's
        `<=` does. None: every slot is busy. REQUIRES self._lock."""
        best, best_sim = None, 0.0
        if self.slot_prompt_similarity and prompt:
            for i, toks in sorted(self.slots.items()):
                if i in busy or not toks:
                    continue
                sim = common_prefix(toks, prompt) / len(prompt)
                if sim > best_sim and sim > self.slot_prompt_similarity:
                    best, best_sim = i, sim
        if best is not None:
            return best
        i = self.total_slots - 1
        while i >= 0 and (i in self.slot_last_used or i in busy):  # bounded by the slots used
            i -= 1
        if i >= 0:
            return i
        idle = [(t, -i) for i, t in self.slot_last_used.items() if i not in busy]
        return -min(idle)[1] if idle else None

    def launch(self, slot: int, prompt: list[str], busy: set[int], *, pinned: bool, completion: bool):
        """What llama-server does around launching a task on `slot`, with the RAM cache on
        (docs/llama-server.md §5): get_available_slot may swap the slot's content through the
        cache (completions only), then idle-slot caching copies every other idle slot to the
        cache and, in a unified pool, clears it. `busy`: the other slots running a task.
        REQUIRES self._lock."""
        if self.ram_cache is None:
            return
        if completion and self._swaps_through_ram_cache(slot, prompt, pinned):
            held = list(self.slots.get(slot) or [])
            self.ram_cache.save(held)
            loaded = self.ram_cache.load(held, prompt)
            if loaded is not None:
                self.slots[slot] = loaded
                self._restored.discard(slot)
            self.ram_cache.update()
        if self.cache_idle_slots:
            for i in sorted(self.slots):
                held = self.slots[i]
                if i == slot or i in busy or not held:
                    continue
                if self.ram_cache.save(held):
                    self.ram_cache.update()
                if self.kv_unified:
                    self.slots[i] = []
                    if i in self.slot_n:
                        self.slot_n[i] = 0

    def _swaps_through_ram_cache(self, slot: int, prompt: list[str], pinned: bool) -> bool:
        """get_available_slot's update_cache for the slot a task was given: a slot chosen (or
        pinned) for its similarity when the prompt keeps less than half of it (f_keep < 0.5); a
        pinned slot the prompt shares too little with, unless it is empty (f_keep 0/0) or the
        similarity choice is off; a slot chosen as least recently used always."""
        held = self.slots.get(slot) or []
        lcp = common_prefix(held, prompt)
        if self.slot_prompt_similarity and held and prompt and lcp / len(prompt) > self.slot_prompt_similarity:
            return lcp / len(held) < 0.5
        if pinned:
            return bool(self.slot_prompt_similarity and held)
        return True

    def busy_slots(self, but: int) -> set[int]:
        """The slots other than `but` that run a task (or a slot action) now. REQUIRES self._lock."""
        return {i for i, x in self._slot_locks.items() if i != but and x.locked()}

    @property
    def url(self) -> str:
        host = "[%s]" % self.host if ":" in self.host else self.host
        return "http://%s:%d" % (host, self.port)

    def start(self):
        self._stopping.clear()
        with self._lock:
            self._reset_slots()
            self.epoch += 1
            self.media_marker = self.pinned_marker or "<__media_%016x__>" % random.getrandbits(64)
        server_class = _ThreadingHTTPServerV6 if ":" in self.host else ThreadingHTTPServer
        httpd = server_class((self.host, self.port), _Handler, bind_and_activate=False)
        httpd.allow_reuse_address = True
        httpd.daemon_threads = True
        # socketserver's default backlog (5) drops SYNs when a proxy opens many upstream
        # connections at once (load tests); llama-server (cpp-httplib) listens with SOMAXCONN.
        httpd.request_queue_size = 1024
        httpd.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        httpd.server_bind()
        httpd.server_activate()
        httpd.fake = self  # type: ignore[attr-defined]
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-llama-%d" % self.port, daemon=True)
        self._thread.start()
        return self

    def _drop_connections(self):
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def kill_connections(self):
        """The part of a kill that is instantaneous: from now on no connection is served, and
        every open one is dropped (a keep-alive connection must not outlive the process)."""
        self._stopping.set()
        self._drop_connections()

    def stop(self):
        """Stops listening and drops every open connection (like a killed process)."""
        self.kill_connections()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()        # the accept loop notices within its poll interval
        httpd.server_close()
        self._drop_connections()  # accepted meanwhile (and refused by the handler)
        if self._thread:
            self._thread.join(timeout=5)

    def restart(self):
        """A new process on the same port: empty slot, new media_marker. Files stay."""
        self.stop()
        deadline = now() + 5
        while True:
            try:
                return self.start()
            except OSError:
                if now() > deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ fault controls
    def sleep(self):
        """llama-server's sleep: the model and every slot's KV are unloaded; /props and
        /health answer without waking it, any other request wakes it (slots stay empty)."""
        with self._lock:
            self.sleeping = True
            self.slots.clear()
            self.slot_n = {}
            if self.ram_cache is not None:
                self.ram_cache.clear()

    def hold_inference(self):
        """Inference requests that start from now on wait before their prefill (their slot
        taken, their arrival recorded) until release_inference(): a test sees which requests
        are in flight at once, however slow the machine."""
        self._inference_gate.clear()

    def release_inference(self):
        self._inference_gate.set()

    def stall(self):
        """As SIGSTOP (a swap storm, a debugger): connections are accepted, and every request
        waits unanswered until resume(); the process and its slots' KV stay as they were."""
        self._running.clear()

    def resume(self):
        """As SIGCONT: the requests that waited are answered, in no particular order."""
        self._running.set()

    def fail_next_save(self, status: int = 500, message: str = "Unable to save slot"):
        with self._lock:
            self._fail_save.append((status, message))

    def fail_next_restore(self, status: int = 400,
                          message: str = "Unable to restore slot: No available space in KV cache or invalid slot save file"):
        with self._lock:
            self._fail_restore.append((status, message))

    def fail_next_erase(self, status: int | str = 500):
        """The next erase answers `status` with an error body and leaves the slot's content as
        it was; "drop" closes the connection without an answer."""
        with self._lock:
            self._fail_erase.append(status)

    def delay_next_restore(self, ms: float):
        with self._lock:
            self._delay_restore.append(ms / 1000.0)

    def delay_next_save(self, ms: float):
        with self._lock:
            self._delay_save.append(ms / 1000.0)

    def crash_next_save(self, fraction: float = 0.5):
        """The next save writes only `fraction` of its snapshot (in place, like llama-server's
        fopen "wb") and then the whole server dies (stop(): every connection dropped, nothing
        answered), as a crash or OOM kill mid-write would leave it. restart() brings it back."""
        with self._lock:
            self._crash_save.append(fraction)

    def fail_next_inference(self, status: int = 500, body: dict | None = None):
        with self._lock:
            self._fail_inference.append(
                (status, body or err_body(status, "fake inference failure", "server_error")))

    # ------------------------------------------------------------------ queries
    def snapshot_path(self, filename: str) -> str:
        assert self.slot_save_path
        return os.path.join(self.slot_save_path, filename)

    def management_calls(self, include_all: bool = False) -> list[dict]:
        """save/restore/erase calls in order (probe and other actions only with include_all)."""
        with self._lock:
            return [dict(m) for m in self.management
                    if include_all or m["action"] in ("save", "restore", "erase")]

    def slot_discipline_violations(self) -> list[str]:
        """Slot actions that arrived while an inference ran on their slot (docs/design.md I8).
        With one slot, any running inference counts (`violations`, recorded as they arrive);
        with several, only a request that ran on the action's slot (pinned there, or placed
        there by the server) from its arrival on: a save of slot 1 while slot 0 streams is what
        a pool is for."""
        if self.total_slots <= 1:
            return list(self.violations)
        placed = [r for r in self.inference_requests() if r.get("slot") is not None]
        bad = []
        for m in self.management_calls():
            for r in placed:
                end = r.get("completed") or r.get("abort_time") or now()
                acted_on = m.get("slot")
                if acted_on is None or acted_on < 0 or self.slot_index(acted_on) != r["slot"]:
                    continue
                if r["time"] < m["time"] < end:
                    bad.append("%s of slot %d at %.3f while request %d ran (%.3f..%.3f)"
                               % (m["action"], m["slot"], m["time"], r["id"], r["time"], end))
        return bad

    def inference_requests(self) -> list[dict]:
        with self._lock:
            return [r for r in self.requests if r["path"] in INFERENCE_PATHS]

    def requests_to(self, path: str) -> list[dict]:
        with self._lock:
            return [r for r in self.requests if r["path"] == path]

    def aborted(self) -> list[dict]:
        with self._lock:
            return [r for r in self.requests if r.get("aborted")]

    def wait_for(self, predicate, timeout: float = 5.0, interval: float = 0.01):
        deadline = now() + timeout
        while True:
            with self._lock:
                v = predicate()
            if v:
                return v
            if now() > deadline:
                return v
            time.sleep(interval)

    # ------------------------------------------------------------------ internals
    def _register_conn(self, sock) -> int:
        with self._lock:
            self._conn_seq += 1
            self._conns[self._conn_seq] = sock
            return self._conn_seq

    def _unregister_conn(self, cid: int):
        with self._lock:
            self._conns.pop(cid, None)
            self.connections_closed.append({"conn": cid, "time": now()})

    def _record(self, rec: dict) -> dict:
        with self._lock:
            self._req_seq += 1
            rec["id"] = self._req_seq
            self.requests.append(rec)
        return rec

    def write_snapshot(self, path: str, tokens: list[str]) -> int:
        blob = "\n".join(tokens).encode("utf-8")
        kv = bytes((i * 31 + 7) & 0xFF for i in range(len(tokens) * self.kv_bytes_per_token))
        payload = struct.pack("<I", len(tokens)) + struct.pack("<I", len(blob)) + blob + kv
        data = MAGIC + struct.pack("<I", FILE_VERSION) + payload + struct.pack("<I", zlib.crc32(payload))
        with open(path, "wb") as f:  # in place, not atomic: like llama-server
            f.write(data)
        return len(data)

    @staticmethod
    def read_snapshot(path: str) -> tuple[list[str], int]:
        """Returns (tokens, bytes read); raises ValueError on any inconsistency."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ValueError("cannot open: %s" % e)
        if len(data) < 16 or data[:4] != MAGIC:
            raise ValueError("bad magic")
        (version,) = struct.unpack_from("<I", data, 4)
        if version != FILE_VERSION:
            raise ValueError("bad version")
        payload, crc = data[8:-4], data[-4:]
        if struct.unpack("<I", crc)[0] != zlib.crc32(payload):
            raise ValueError("checksum mismatch")
        n, blen = struct.unpack_from("<II", payload, 0)
        blob = payload[8:8 + blen]
        tokens = blob.decode("utf-8").split("\n") if blen else []
        if len(tokens) != n:
            raise ValueError("token count mismatch")
        return tokens, len(data)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llama.cpp"
    sys_version = ""

    # --- plumbing --------------------------------------------------------------
    @property
    def fake(self) -> FakeLlamaServer:
        return self.server.fake  # type: ignore[attr-defined]

    def setup(self):
        super().setup()
        # no Nagle: each write (a JSON answer, an SSE chunk) leaves at once
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn_id = self.fake._register_conn(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.fake._unregister_conn(self.conn_id)

    def log_message(self, fmt, *args):  # quiet
        pass

    def handle_one_request(self):
        if self.fake._stopping.is_set():    # killed: nothing is served any more
            self.close_connection = True
            return
        wait = self.fake.keep_alive_timeout
        if wait and not select.select([self.connection], [], [], wait)[0]:
            self.close_connection = True    # no request within the keep-alive timeout
            return
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout, OSError):
            self.close_connection = True

    def _read_body(self) -> bytes:
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            out = bytearray()
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(65537)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send_json(self, status: int, obj, extra: dict | None = None):
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Keep-Alive", "timeout=5, max=100")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        # header and body in one write, as llama-server (cpp-httplib) does for small bodies
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(data)
        self.wfile.write(b"".join(self._headers_buffer))
        self._headers_buffer = []
        self.rec["status"] = status

    def _dispatch(self):
        f = self.fake
        f._running.wait(120)
        raw_path = self.path
        # cpp-httplib decodes %XX (and %uXXXX) in the path before routing
        path, raw_query = httplib_split_target(raw_path)
        query = dict(urllib.parse.parse_qsl(raw_query, keep_blank_values=True))
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        body_json = None
        if body:
            try:
                body_json = json.loads(body)
            except (ValueError, RecursionError):  # RecursionError: deeply nested (hostile) JSON
                body_json = None
        if self.command == "POST" and path == "/completion" and isinstance(body_json, dict) and body_json.get("n_probs"):
            return self._behaviour_probe(body_json)
        self.rec = f._record({
            "time": now(), "method": self.command, "raw_path": raw_path, "path": path,
            "query": query, "headers": list(self.headers.items()),
            "headers_lower": {k.lower(): v for k, v in self.headers.items()},
            "body": body, "json": body_json, "conn": self.conn_id, "epoch": f.epoch,
            "status": None, "events": [], "aborted": False,
        })
        try:
            self._route(path, query, body_json, body)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = lambda self: self._dispatch()  # noqa: E731

    # --- routing ---------------------------------------------------------------
    def _lets_sleep(self, method, path) -> bool:
        """Whether a request leaves a sleeping server asleep (docs/llama-server.md §11): health
        and /props post no task, nor does a slot list refused with 501 (--no-slots)."""
        if method != "GET":
            return False
        return path in ("/health", "/v1/health", "/props") or (path == "/slots" and self.fake.slots_status != 200)

    def _route(self, path, query, body_json, body):
        f = self.fake
        m = self.command
        if f.sleeping and not self._lets_sleep(m, path):
            with f._lock:
                f.sleeping = False
                f.wakes += 1
        if m == "GET" and path in ("/health", "/v1/health"):
            return self._send_json(200, {"status": "ok"})
        if m == "GET" and path == "/props":
            if f.props_status != 200:
                return self._send_json(f.props_status, err_body(f.props_status, "Loading model", "unavailable_error"))
            return self._send_json(200, f.raw_replies.get("props") or self._props())
        if m == "GET" and path in ("/v1/models", "/models"):
            if f.models_status != 200:
                return self._send_json(f.models_status, err_body(f.models_status, "Forbidden", "forbidden_error"))
            return self._send_json(200, self._models())
        if m == "GET" and path == "/lora-adapters":
            with f._lock:
                return self._send_json(200, [dict(a) for a in f.lora])
        if m == "POST" and path == "/lora-adapters":
            if not isinstance(body_json, list):
                return self._send_json(400, err_body(400, "Request body must be an array", "invalid_request_error"))
            with f._lock:
                for item in body_json:
                    for a in f.lora:
                        if isinstance(item, dict) and item.get("id") == a["id"]:
                            a["scale"] = float(item.get("scale", 0.0))
            return self._send_json(200, {"success": True})
        if m == "GET" and path == "/slots":
            if f.slots_status != 200:
                return self._send_json(f.slots_status, err_body(f.slots_status, "This server does not support slots endpoint.",
                                                                "not_supported_error"))
            with f._lock:
                used = dict(f.slot_n)
                tasks = dict(f.slot_task)
            slots = [{"id": i, "n_ctx": f.n_ctx, "speculative": False, "is_processing": False}
                     for i in range(f.total_slots)]
            for i, n in used.items():
                if i < len(slots):
                    slots[i]["n_prompt_tokens"] = n
            for i, t in tasks.items():
                slots[i]["id_task"] = t
            return self._send_json(200, slots)
        if m == "POST" and path.startswith("/slots/"):
            return self._slot_action(path[len("/slots/"):], query, body_json, body)
        if m == "POST" and path == "/tokenize":
            content = (body_json or {}).get("content", "")
            toks = tokenize(content if isinstance(content, str) else "")
            return self._send_json(200, {"tokens": [zlib.crc32(t.encode()) % 32000 for t in toks]})
        if m == "POST" and path in INFERENCE_PATHS:
            return self._inference(path, body_json)
        if m == "POST" and f.predict_route and path == f.predict_route:
            if not isinstance(body_json, dict) or not isinstance(body_json.get("instances"), list):
                return self._send_json(400, err_body(400, "request body must include an array field named "
                                                          "instances", "invalid_request_error"))
            return self._send_json(200, {"predictions": []})  # instances are not modelled
        return self._send_json(404, {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}})

    def _props(self):
        f = self.fake
        return {
            "default_generation_settings": {"params": {"n_predict": -1, "temperature": 0.8}, "n_ctx": f.n_ctx},
            "total_slots": f.total_slots,
            "model_alias": os.path.basename(f.model_path),
            "model_ftype": "Q8_0",
            "model_path": f.model_path,
            "modalities": {"vision": False, "audio": False},
            "media_marker": f.media_marker,
            "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": False,
            "chat_template": f.chat_template,
            "bos_token": "<s>", "eos_token": "</s>",
            "build_info": f.build_info,
            "is_sleeping": f.sleeping,
        }

    def _models(self):
        f = self.fake
        name = os.path.basename(f.model_path)
        return {
            "models": [{"name": name, "model": name}],
            "object": "list",
            "data": [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "llamacpp",
                      "meta": dict(f.model_meta, n_ctx=f.n_ctx)}],
        }

    # --- slot actions ----------------------------------------------------------
    def _slot_action(self, id_text, query, body_json, body):
        f = self.fake
        action = query.get("action", "")
        mrec = {"time": now(), "action": action or "(none)", "slot_text": id_text, "filename": None,
                "status": None, "response": None, "epoch": f.epoch, "request_id": self.rec["id"]}
        with f._lock:
            f.management.append(mrec)
            if action in ("save", "restore", "erase"):
                for rid, s in f._active.items():
                    if not peer_closed(s):
                        f.violations.append("%s arrived while inference request %d was running" % (action, rid))

        held = []  # the slot's lock, while the action holds it

        def reply(status, obj):
            mrec["status"] = status
            mrec["response"] = obj
            mrec["done"] = now()
            # The task is over before its answer goes out, as on llama-server's main loop: a
            # client that sends its next request on the answer never finds the slot busy.
            while held:
                held.pop().release()
            self._send_json(status, obj)

        if f.slot_actions_disabled:
            return reply(501, err_body(501, "This server does not support slots action. Start it with `--slot-save-path`",
                                       "not_supported_error"))
        try:
            id_slot = int(id_text.strip().split("/")[0] or "x")
        except ValueError:
            return reply(400, err_body(400, "Invalid slot ID", "invalid_request_error"))
        mrec["slot"] = id_slot
        if action not in ("save", "restore", "erase"):
            return reply(400, err_body(400, "Invalid action", "invalid_request_error"))

        filename = None
        if action in ("save", "restore"):
            if not isinstance(body_json, dict) or not isinstance(body_json.get("filename"), str):
                return reply(500, err_body(500, "[json.exception.type_error.302] type must be string", "server_error"))
            filename = body_json["filename"]
            mrec["filename"] = filename
            if not validate_filename(filename):
                return reply(400, err_body(400, "Invalid filename", "invalid_request_error"))
        if id_slot < 0:
            return reply(400, err_body(400, "Invalid slot ID", "invalid_request_error"))

        fault = f.management_fault
        if action == "erase":
            with f._lock:
                erase_fault = f._fail_erase.pop(0) if f._fail_erase else None
            if erase_fault is not None:
                fault = erase_fault
        if fault == "drop":
            mrec["status"] = "dropped"
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if isinstance(fault, int):
            return reply(fault, err_body(fault, "fake management fault", "server_error"))

        # slot actions run on the main loop: they wait while the slot is busy (deferred)
        slot = f.slot_index(id_slot)
        slot_lock = f.slot_lock(slot)
        if not slot_lock.acquire(timeout=30):
            return reply(503, err_body(503, "fake: slot busy for 30 s", "unavailable_error"))
        held.append(slot_lock)
        try:
            with f._lock:
                extra = f.management_delay
                if action == "save" and f._delay_save:
                    extra += f._delay_save.pop(0)
                if action == "restore" and f._delay_restore:
                    extra += f._delay_restore.pop(0)
            if extra:
                time.sleep(extra)
            t0 = now()
            if action == "erase":
                with f._lock:
                    n = len(f.slots[slot])
                    f.slots[slot] = []
                    if slot in f.slot_n:
                        f.slot_n[slot] = 0
                return reply(200, {"id_slot": id_slot, "n_erased": n})
            path = os.path.join(f.slot_save_path, filename)
            if action == "save":
                with f._lock:
                    failure = f._fail_save.pop(0) if f._fail_save else None
                    tokens = list(f.slots[slot])
                if failure:
                    return reply(failure[0], err_body(failure[0], failure[1],
                                                      "server_error" if failure[0] >= 500 else "invalid_request_error"))
                with f._lock:
                    crash = f._crash_save.pop(0) if f._crash_save else None
                mrec["head"] = tokens[:8]
                if crash is not None:
                    n_full = f.write_snapshot(path, tokens)
                    with open(path, "r+b") as fh:
                        fh.truncate(int(n_full * crash))
                    mrec["status"] = "crashed"
                    mrec["n"] = len(tokens)
                    self.close_connection = True
                    f.kill_connections()    # this one too: the caller sees the save die
                    threading.Thread(target=f.stop, name="fake-crash", daemon=True).start()
                    return
                n_written = f.write_snapshot(path, tokens)
                mrec["n"] = len(tokens)
                return reply(200, f.raw_replies.get("save") or
                             {"id_slot": id_slot, "filename": filename, "n_saved": len(tokens),
                              "n_written": n_written, "timings": {"save_ms": (now() - t0) * 1000.0}})
            # restore
            with f._lock:
                failure = f._fail_restore.pop(0) if f._fail_restore else None
            if failure:
                with f._lock:
                    f.slots[slot] = []  # a failed restore clears the slot
                return reply(failure[0], err_body(failure[0], failure[1],
                                                  "server_error" if failure[0] >= 500 else "invalid_request_error"))
            try:
                tokens, n_read = f.read_snapshot(path)
                if len(tokens) > f.n_ctx:
                    raise ValueError("Restored prompt does not fit in the slot context")
            except ValueError:
                with f._lock:
                    f.slots[slot] = []
                return reply(400, err_body(400, "Unable to restore slot: No available space in KV cache or invalid slot save file",
                                           "invalid_request_error"))
            with f._lock:
                f.slots[slot] = tokens
                f._restored.add(slot)
                delta = f.restore_n_delta
                if slot in f.slot_n:   # a slot that never ran a task shows no count (docs/llama-server.md §2)
                    f.slot_n[slot] = len(tokens)
            mrec["n"] = len(tokens)
            mrec["head"] = tokens[:8]
            return reply(200, {"id_slot": id_slot, "filename": filename, "n_restored": len(tokens) + delta,
                               "n_read": n_read, "timings": {"restore_ms": (now() - t0) * 1000.0}})
        finally:
            while held:
                held.pop().release()

    def _behaviour_probe(self, j):
        """One greedy token with its ranked alternatives, as llama-server answers n_probs. Recorded
        with the management calls (action "behaviour"), not as an inference request."""
        f = self.fake
        self.rec = {"status": None, "events": []}  # not in f.requests
        with f._lock:
            seed = random.random() if f.probe_flicker else f.weights_seed
            f.management.append({"time": now(), "action": "behaviour", "slot": j.get("id_slot"),
                                 "slot_text": str(j.get("id_slot")), "filename": None, "status": 200,
                                 "done": now(), "response": None, "epoch": f.epoch, "request_id": None})
        obj = {"index": 0, "content": "x", "tokens_predicted": 1, "stop": True,
               "timings": {"cache_n": 0, "prompt_n": 16, "predicted_n": 1}}
        if f.probe_probs:
            ids = random.Random(seed).sample(range(32000), int(j.get("n_probs", 8)))
            obj["completion_probabilities"] = [{"id": ids[0], "logprob": -9.0, "top_logprobs": [
                {"id": t, "logprob": -9.0 - 0.01 * k} for k, t in enumerate(ids)]}]
        self._send_json(200, obj)

    # --- inference ---------------------------------------------------------------
    def _prompt_tokens(self, path, j) -> list[str]:
        if path in ("/v1/chat/completions", "/chat/completions", "/v1/messages"):
            msgs = list(j.get("messages") or [])
            if path == "/v1/messages" and j.get("system"):
                msgs.insert(0, {"role": "system", "content": j.get("system")})
            return chat_tokens(msgs)
        if path == "/v1/responses":
            inp = j.get("input")
            if isinstance(inp, list):
                return chat_tokens(inp)
            return chat_tokens([{"role": "user", "content": inp}])
        for key in ("prompt", "input", "content", "query", "input_prefix"):
            v = j.get(key)
            if isinstance(v, str):
                return tokenize(v)
            if isinstance(v, list):
                return tokenize(" ".join(x for x in v if isinstance(x, str)))
        return []

    def _check_abort(self):
        if self.fake._stopping.is_set() or peer_closed(self.connection):
            raise _Aborted()

    def _sleep_watching(self, seconds: float):
        end = now() + seconds
        while True:
            self._check_abort()
            left = end - now()
            if left <= 0:
                return
            time.sleep(min(POLL_S, left))

    def _write_chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")

    def _inference(self, path, j):
        f = self.fake
        if not isinstance(j, dict):
            return self._send_json(400, err_body(400, "invalid JSON body", "invalid_request_error"))
        with f._lock:
            failure = f._fail_inference.pop(0) if f._fail_inference else None
        if failure:
            return self._send_json(failure[0], failure[1])
        prompt = self._prompt_tokens(path, j)
        k = j.get("id_slot") if path in PINNABLE_PATHS else None
        pinned = f.slot_index(k) if isinstance(k, int) and not isinstance(k, bool) and k >= 0 else None
        task = {"pinned": pinned is not None, "completion": path in COMPLETION_PATHS}
        if pinned is None and f.total_slots == 1:
            pinned = 0
        if pinned is not None:
            with f._lock:
                f.slot_n[pinned] = max(len(prompt), 1)
        if len(prompt) > f.n_ctx:
            return self._send_json(400, {"error": {"code": 400, "message": "the request exceeds the available context size",
                                                   "type": "exceed_context_size_error", "n_prompt_tokens": len(prompt),
                                                   "n_ctx": f.n_ctx}})
        stream = bool(j.get("stream"))
        n_predict = j.get("max_tokens", j.get("n_predict", f.n_predict))
        if not isinstance(n_predict, int) or n_predict < 0:
            n_predict = f.n_predict
        is_embed = "embed" in path or "rerank" in path
        rid = self.rec["id"]

        # wait for the slot (a request for a busy slot is deferred, without headers)
        taken = self._take_slot(pinned, prompt, task)
        if taken is None:
            self._mark_abort("queued", 0)
            return
        slot, slot_lock = taken
        released = []

        def finish():
            # The slot is released when the task ends, before the last bytes go out (as in
            # llama-server), so a proxy that reacts to the end of the response never races it.
            if not released:
                released.append(True)
                with f._lock:
                    f._active.pop(rid, None)
                    f.slot_last_used[slot] = now()
                slot_lock.release()

        self._finish_inference = finish
        try:
            with f._lock:
                f._active[rid] = self.connection
                before = list(f.slots[slot])
                if slot in f._restored and not f.reuse_after_restore:
                    before = []
                f._restored.discard(slot)
            cache_n = common_prefix(before, prompt)
            if cache_n >= len(prompt) and prompt:
                cache_n = len(prompt) - 1  # llama-server re-evaluates at least one token
            prompt_n = len(prompt) - cache_n
            self.rec.update({"prompt_tokens": len(prompt), "cache_n": cache_n, "prompt_n": prompt_n,
                             "slot_before": len(before), "slot_before_head": before[:8],
                             "prompt_head": prompt[:8]})
            with f._lock:
                f.slots[slot] = prompt[:cache_n]  # the rest is being processed
            t_start = now()
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("X-Accel-Buffering", "no")
                self.send_header("Keep-Alive", "timeout=5, max=100")
                self.end_headers()
                self.rec["status"] = 200
            phase = "prefill"
            try:
                while not f._inference_gate.wait(POLL_S):
                    self._check_abort()
                if f.prefill_delay:
                    self._sleep_watching(f.prefill_delay)
                with f._lock:
                    f.slots[slot] = list(prompt)  # prompt processed (even if cancelled later)
                t_prompt = now()
                phase = "generate"
                if is_embed:
                    return self._embedding_response(path, j, prompt)
                gen = ["tok%d" % (len(prompt) + i) for i in range(n_predict)]
                if stream:
                    self._stream(path, j, prompt, gen, cache_n, prompt_n, t_start, t_prompt)
                else:
                    with f._lock:
                        f.slots[slot] = list(prompt) + gen
                        self.rec["completed"] = now()
                    self._final_json(path, j, prompt, gen, cache_n, prompt_n, t_start, t_prompt)
            except _Aborted:
                self._mark_abort(phase, len(self.rec["events"]))
            except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                self._mark_abort(phase, len(self.rec["events"]))
        finally:
            finish()

    def _take_slot(self, pinned, prompt, task):
        """(slot, its lock, held) for the task, once a slot is free: `pinned`, or the one
        get_available_slot picks among the idle ones; None when the client left meanwhile.
        The task is launched there (FakeLlamaServer.launch; `task`: pinned by the client, a
        completion). With concurrent_inference a request never waits (a fresh lock), placed
        all the same."""
        f = self.fake
        if pinned is not None:
            lock = threading.Lock() if f.concurrent_inference else f.slot_lock(pinned)
            while not lock.acquire(timeout=POLL_S):
                if peer_closed(self.connection) or f._stopping.is_set():
                    return None
            with f._lock:
                self.rec["slot"] = pinned
                f.slot_task[pinned] = self.rec["id"]
                f.launch(pinned, prompt, f.busy_slots(pinned), **task)
            return pinned, lock
        while True:
            with f._lock:
                busy = set() if f.concurrent_inference else f.busy_slots(-1)
                slot = f.place_unpinned(prompt, busy)
                lock = None if slot is None else threading.Lock() if f.concurrent_inference else f.slot_lock(slot)
                if lock is not None and lock.acquire(blocking=False):
                    self.rec["slot"] = slot
                    f.slot_task[slot] = self.rec["id"]
                    f.slot_n[slot] = max(len(prompt), 1)
                    f.launch(slot, prompt, busy, **task)
                    return slot, lock
            if peer_closed(self.connection) or f._stopping.is_set():
                return None
            time.sleep(POLL_S)

    def _mark_abort(self, phase, events):
        with self.fake._lock:
            self.rec["aborted"] = True
            self.rec["abort_phase"] = phase
            self.rec["abort_time"] = now()
            self.rec["abort_after_events"] = events
        self.close_connection = True

    def _timings(self, cache_n, prompt_n, n_gen, t_start, t_prompt):
        prompt_ms = (t_prompt - t_start) * 1000.0
        pred_ms = max((now() - t_prompt) * 1000.0, 0.001)
        return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
                "prompt_per_second": 1000.0 * prompt_n / max(prompt_ms, 0.001),
                "predicted_n": n_gen, "predicted_ms": pred_ms,
                "predicted_per_token_ms": pred_ms / max(n_gen, 1),
                "predicted_per_second": 1000.0 * n_gen / pred_ms}

    def _final_json(self, path, j, prompt, gen, cache_n, prompt_n, t_start, t_prompt):
        f = self.fake
        text = " ".join(gen)
        timings = self._timings(cache_n, prompt_n, len(gen), t_start, t_prompt)
        usage = {"completion_tokens": len(gen), "prompt_tokens": len(prompt),
                 "total_tokens": len(prompt) + len(gen), "prompt_tokens_details": {"cached_tokens": cache_n}}
        created = int(time.time())
        if path in ("/v1/chat/completions", "/chat/completions"):
            obj = {"choices": [{"finish_reason": f.finish_reason, "index": 0,
                                "message": {"role": "assistant", "content": text}}],
                   "created": created, "model": j.get("model") or "fake", "system_fingerprint": f.build_info,
                   "object": "chat.completion", "usage": usage, "id": "chatcmpl-%d" % self.rec["id"],
                   "timings": timings}
        elif path in ("/v1/completions", "/completions"):
            obj = {"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "length"}],
                   "created": created, "model": j.get("model") or "fake", "system_fingerprint": f.build_info,
                   "object": "text_completion", "usage": usage, "id": "cmpl-%d" % self.rec["id"],
                   "timings": timings}
        elif path == "/v1/messages":
            obj = {"id": "msg_%d" % self.rec["id"], "type": "message", "role": "assistant",
                   "content": [{"type": "text", "text": text}], "model": j.get("model") or "fake",
                   "stop_reason": "max_tokens", "stop_sequence": None,
                   "usage": {"input_tokens": prompt_n, "output_tokens": len(gen), "cache_read_input_tokens": cache_n}}
        elif path == "/v1/responses":
            obj = {"id": "resp_%d" % self.rec["id"], "object": "response", "status": "completed",
                   "output": [{"type": "message", "role": "assistant",
                               "content": [{"type": "output_text", "text": text}]}],
                   "usage": {"input_tokens": len(prompt), "output_tokens": len(gen),
                             "input_tokens_details": {"cached_tokens": cache_n}}}
        else:  # native /completion, /infill
            obj = {"index": 0, "content": text, "tokens": [], "id_slot": self.rec["slot"], "stop": True,
                   "model": "fake", "tokens_predicted": len(gen), "tokens_evaluated": len(prompt),
                   "generation_settings": {}, "prompt": " ".join(prompt), "has_new_line": False,
                   "truncated": False, "stop_type": "limit", "stopping_word": "",
                   "tokens_cached": len(prompt) + len(gen), "timings": timings}
        self._finish_inference()
        self._send_json(200, obj)

    def _embedding_response(self, path, j, prompt):
        vec = [((zlib.crc32(" ".join(prompt).encode()) >> (i % 24)) & 0xFF) / 255.0 for i in range(8)]
        if path.startswith("/v1/"):
            obj = {"model": "fake", "object": "list", "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt)},
                   "data": [{"embedding": vec, "index": 0, "object": "embedding"}]}
        else:
            obj = [{"index": 0, "embedding": [vec]}]
        self._finish_inference()
        self._send_json(200, obj)

    def _stream(self, path, j, prompt, gen, cache_n, prompt_n, t_start, t_prompt):
        f = self.fake
        chat = path in ("/v1/chat/completions", "/chat/completions")
        oai = chat or path in ("/v1/completions", "/completions")
        created = int(time.time())
        cid = "chatcmpl-%d" % self.rec["id"]
        events: list[bytes] = []

        def chunk_obj(delta_text, finish=None, timings=None):
            if chat:
                o = {"choices": [{"finish_reason": finish, "index": 0,
                                  "delta": ({"content": delta_text} if delta_text is not None else {})}],
                     "created": created, "id": cid, "model": j.get("model") or "fake",
                     "system_fingerprint": f.build_info, "object": "chat.completion.chunk"}
            elif oai:
                o = {"choices": [{"text": delta_text or "", "index": 0, "logprobs": None, "finish_reason": finish}],
                     "created": created, "id": cid, "model": j.get("model") or "fake",
                     "system_fingerprint": f.build_info, "object": "text_completion"}
            else:
                o = {"index": 0, "content": delta_text or "", "tokens": [], "stop": finish is not None,
                     "id_slot": -1, "tokens_predicted": 0, "tokens_evaluated": len(prompt)}
                if finish is not None:
                    o.update({"id_slot": self.rec["slot"], "tokens_cached": len(prompt) + len(gen), "stop_type": "limit",
                              "tokens_predicted": len(gen)})
            if timings is not None:
                o["timings"] = timings
            return o

        for i, word in enumerate(gen):
            events.append(b"data: " + json.dumps(chunk_obj((" " if i else "") + word)).encode() + b"\n\n")
        final = chunk_obj(None if chat else "", finish=f.finish_reason)
        events.append(None)  # placeholder: the final chunk carries timings computed at the end
        done = [b"data: [DONE]\n\n"] if oai else []

        sent_tokens = 0
        for i in range(len(events)):
            if i > 0 and f.event_delay:
                self._sleep_watching(f.event_delay)
            else:
                self._check_abort()
            if f.stream_kill_after is not None and i >= f.stream_kill_after:
                with f._lock:
                    self.rec["killed"] = True
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if f.stream_error_after is not None and i >= f.stream_error_after:
                ev = b"data: " + json.dumps(err_body(500, "fake mid-stream failure", "server_error")).encode() + b"\n\n"
                self._send_event(ev)
                self.close_connection = True
                # the task has ended: release the slot before the last bytes (as every other path)
                self._finish_inference()
                self.wfile.write(b"0\r\n\r\n")
                return
            ev = events[i]
            if ev is None:
                with f._lock:
                    f.slots[self.rec["slot"]] = list(prompt) + gen
                timings = self._timings(cache_n, prompt_n, len(gen), t_start, t_prompt)
                final["timings"] = timings
                if oai:
                    final["usage"] = {"completion_tokens": len(gen), "prompt_tokens": len(prompt),
                                      "total_tokens": len(prompt) + len(gen),
                                      "prompt_tokens_details": {"cached_tokens": cache_n}}
                ev = b"data: " + json.dumps(final).encode() + b"\n\n"
                if not done:
                    self._finish_inference()
            else:
                sent_tokens += 1
                with f._lock:
                    f.slots[self.rec["slot"]] = list(prompt) + gen[:sent_tokens]
            self._send_event(ev)
        for ev in done:
            if f.event_delay:
                self._sleep_watching(f.event_delay)
            self._finish_inference()
            self._send_event(ev)
        self._finish_inference()
        with f._lock:
            self.rec["completed"] = now()
        self.wfile.write(b"0\r\n\r\n")

    def _send_event(self, ev: bytes):
        t = now()
        with self.fake._lock:
            self.rec["events"].append((t, ev))
        self._write_chunk(ev)


def slots_arg(text: str) -> int | str:
    return text if text == "auto" else int(text)


def cli_args(argv=None) -> argparse.Namespace:
    """The script's options; `--preset NAME` sets the RAM-cache and slot options of PRESETS
    (--cache-ram in MiB, as llama-server's), and the options given beside it override them."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--slot-save-path", default=None)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None,
                    help="defaults: as `llama-server -m model.gguf` (4 slots, one unified pool, "
                         "--cache-ram 8192, idle slots cached)")
    ap.add_argument("--total-slots", type=slots_arg, default=1, help="a number, or auto (4, unified)")
    ap.add_argument("--kv-unified", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--cache-idle-slots", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--cache-ram", type=int, default=0, help="MiB; 0 off, -1 no limit")
    ap.add_argument("--slot-prompt-similarity", type=float, default=0.1)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--n-predict", type=int, default=4)
    ap.add_argument("--event-delay-ms", type=float, default=0.0)
    ap.add_argument("--prefill-delay-ms", type=float, default=0.0)
    a = ap.parse_args(argv)
    if a.preset:
        p = PRESETS[a.preset]
        ap.set_defaults(total_slots=p["total_slots"], cache_idle_slots=p["cache_idle_slots"],
                        cache_ram=p["cache_ram_bytes"] >> 20, slot_prompt_similarity=p["slot_prompt_similarity"])
        a = ap.parse_args(argv)
    return a


def main():
    a = cli_args()
    if a.slot_save_path:
        os.makedirs(a.slot_save_path, exist_ok=True)
    cache_ram_bytes = a.cache_ram << 20 if a.cache_ram > 0 else a.cache_ram
    f = FakeLlamaServer(a.slot_save_path, port=a.port, host=a.host, total_slots=a.total_slots, n_ctx=a.n_ctx,
                        n_predict=a.n_predict, event_delay=a.event_delay_ms / 1000.0,
                        prefill_delay=a.prefill_delay_ms / 1000.0, kv_unified=a.kv_unified,
                        cache_idle_slots=a.cache_idle_slots, cache_ram_bytes=cache_ram_bytes,
                        slot_prompt_similarity=a.slot_prompt_similarity)
    f.start()
    print("fake llama-server listening on %s (slot actions %s)" %
          (f.url, "disabled" if f.slot_actions_disabled else "enabled"), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    f.stop()


if __name__ == "__main__":
    main()
