"""Loopback scale-out: nginx (Debian's, `hash $http_x_session_id consistent`) in front of two
kvpersist + llama-server pairs that share llama-server's --slot-save-path and kvpersist's state
directory, with the same instanceKey and runtimeKey (and the same model file and -c, so the
runtime fingerprints match).

1. Sessions stick to a node: every request of a session reaches the same kvpersist (nginx's
   access log names the upstream; only that kvpersist logs the session).
2. Pair A is stopped (SIGTERM to kvpersist A, which checkpoints its dirty slot on shutdown,
   then llama-server A is killed). A's sessions continue through nginx on node B, which reads
   their manifests from the shared state dir and restores their snapshots from the shared
   save dir (kv.session.restore.success on B; cache_n >= 90% of the session's first prompt).

The nginx config is the shipped docker/nginx-scaleout.conf with the upstream servers, the
listen port and the file paths rewritten for the test (multislot_helpers.nginx_conf_for_test).

Two variants: `test_scaleout_fake` (two in-process fakes, runs in the fake suite) and
`test_scaleout_real` (two real `llama-server -np 1`, real_only):

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \
      KVP_MODEL=$(scripts/test-model.sh ci) \
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_scaleout.py
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from kvptest import fake_llama
from kvptest.chat import Chat
from kvptest.checks import ok
from kvptest.identity import abbrev, session_hash
from kvptest.kvpersist_process import KvPersist
from kvptest.manifests import manifest_for
from kvptest.multislot_helpers import Llama, Nginx, nginx_binary, require_real_llama, start_proxy
from kvptest.net import free_port
from kvptest.paths import REPO_ROOT, kvpersist_bin
from kvptest.waiting import now, wait_until

INSTANCE = "scale"
RUNTIME_KEY = "scale-runtime-1"
REUSE = 0.9


@pytest.fixture
def nginx_ok():
    if not nginx_binary():
        pytest.skip("nginx is not installed (apt-get install nginx-light)")


class Node:
    def __init__(self, name, upstream, proxy):
        self.name = name
        self.upstream = upstream    # fake_llama.FakeLlamaServer or Llama
        self.proxy: KvPersist = proxy

    def logged(self, short: str) -> list[str]:
        """Session events this node's kvpersist logged for the session (abbreviated hash)."""
        return [l.event for l in self.proxy.log_lines()
                if l.fields.get("session") == short and l.event.startswith("kv.session.")]


class Cluster:
    def __init__(self, tmp_path, kind: str):
        self.tmp = str(tmp_path)
        self.kind = kind
        self.save_dir = os.path.join(self.tmp, "shared-slots")
        self.state_dir = os.path.join(self.tmp, "shared-state")
        os.makedirs(self.save_dir, exist_ok=True)
        self.nodes: dict[str, Node] = {}
        self.upstreams: list = []   # everything started, even if a later step fails
        self.nginx: Nginx | None = None
        self.model = ""

    def start(self):
        if not os.access(kvpersist_bin(), os.X_OK):
            pytest.skip("kvpersist binary not found at %s (set KVPERSIST_BIN)" % kvpersist_bin())
        for name in ("a", "b"):
            workdir = os.path.join(self.tmp, "node-" + name)
            os.makedirs(workdir, exist_ok=True)
            if self.kind == "fake":
                up = fake_llama.FakeLlamaServer(self.save_dir, n_predict=4).start()
                self.upstreams.append(up)
                self.model = up.model_path
            else:
                # -t 1 each: two servers on a 2-core machine, with a core left for the rest.
                up = Llama(workdir, n_parallel=1, ctx_per_slot=4096, save_dir=self.save_dir, threads=1,
                           name="llama-" + name)
                self.upstreams.append(up)
                up.start()
            if self.kind != "fake":
                self.model = up.props()["model_path"]
            cfg = {"instanceKey": INSTANCE, "checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0,
                   "snapshots": {"management": "shared-filesystem", "path": self.save_dir}}
            proxy = start_proxy(up.url, self.state_dir, workdir, cfg, runtime_key=RUNTIME_KEY)
            assert proxy.wait_for_log(r"kv\.backend\.ready", 10), proxy.log_text()
            self.nodes[name] = Node(name, up, proxy)
        self.nginx = Nginx(self.tmp, free_port(), [n.proxy.port for n in self.nodes.values()])
        t = self.nginx.test_config()
        assert t.returncode == 0, t.stderr.decode()
        self.nginx.start()
        return self

    @property
    def port(self) -> int:
        return self.nginx.port

    def short(self, chat: Chat) -> str:
        return abbrev(session_hash(chat.id, self.model, INSTANCE))

    def served_by(self, chat: Chat) -> list[str]:
        """The nodes nginx sent this session's requests to, from its access log (in order; nginx
        writes the line just after the response, so wait for one line per reply)."""
        want = len(chat.replies)
        got = wait_until(lambda: len(self._served_by(chat)) >= want and self._served_by(chat), 5)
        return got or []

    def _served_by(self, chat: Chat) -> list[str]:
        by_port = {str(n.proxy.port): name for name, n in self.nodes.items()}
        out = []
        for line in self.nginx.access_log().splitlines():
            if "sid=%s " % chat.id not in line:
                continue
            m = re.search(r"upstream=(.*?) rt=", line)
            addrs = m.group(1).split(",") if m else []
            # after a failover nginx logs every address it tried: the last one answered
            port = addrs[-1].strip().rsplit(":", 1)[-1] if addrs else ""
            out.append(by_port.get(port, port))
        return out

    def stop_pair(self, name: str):
        n = self.nodes[name]
        rc = n.proxy.stop(signal.SIGTERM, timeout=30)
        assert rc == 0, "kvpersist %s exited %s on SIGTERM" % (name, rc)
        cp = [l for l in n.proxy.log_lines() if l.event == "kv.shutdown.checkpoint"]
        assert cp and cp[-1].fields.get("result") == "ok", n.proxy.log_text()
        if self.kind == "fake":
            n.upstream.stop()
        else:
            n.upstream.kill()

    def close(self):
        if self.nginx:
            self.nginx.stop()
        for n in self.nodes.values():
            if n.proxy.alive():
                n.proxy.stop(signal.SIGKILL, timeout=5)
        for up in self.upstreams:
            if self.kind == "fake":
                up.stop()
            else:
                up.kill()

    def dump(self) -> str:
        out = []
        for name, n in self.nodes.items():
            out.append("---- kvpersist %s (port %s)\n%s" % (name, n.proxy.port, n.proxy.log_text()))
        if self.nginx:
            out.append("---- nginx access log\n" + self.nginx.access_log())
            out.append("---- nginx stderr\n" + self.nginx.log())
        return "\n".join(out)


def run_scaleout(cluster: Cluster, prompt_tokens: int):
    tok_port = next(iter(cluster.nodes.values())).upstream.port
    # 1. Sessions until each node has at least two (the ring decides; bounded).
    chats: list[Chat] = []
    home: dict[str, str] = {}
    for i in range(16):
        c = Chat(tok_port, "so%d" % i, prompt_tokens)
        ok(c.ask(cluster.port), "%s#1" % c.id)
        chats.append(c)
        (node,) = cluster.served_by(c)
        home[c.id] = node
        if all(sum(1 for v in home.values() if v == n) >= 2 for n in cluster.nodes):
            break
    counts = {n: sum(1 for v in home.values() if v == n) for n in cluster.nodes}
    assert all(v >= 2 for v in counts.values()), "the ring put the sessions on %s" % counts

    # 2. Stickiness: another round, every request goes to the same node, and only that node's
    #    kvpersist ever logged the session.
    for c in chats:
        ok(c.ask(cluster.port), "%s#2" % c.id)
    for c in chats:
        assert cluster.served_by(c) == [home[c.id]] * 2, (c.id, cluster.served_by(c))
        mine, other = cluster.nodes[home[c.id]], cluster.nodes["b" if home[c.id] == "a" else "a"]
        assert mine.logged(cluster.short(c)), (c.id, "not logged on its node")
        assert other.logged(cluster.short(c)) == [], (c.id, other.logged(cluster.short(c)))

    # 3. Stop pair A (kvpersist first: it saves its dirty slot on SIGTERM).
    a_chats = [c for c in chats if home[c.id] == "a"]
    b_chats = [c for c in chats if home[c.id] == "b"]
    cluster.stop_pair("a")
    for c in a_chats:
        m = manifest_for(cluster.state_dir, c.id)
        assert m and m["state"] == "ready", (c.id, m)
        assert os.path.isfile(os.path.join(cluster.save_dir, m["snapshotFile"])), m
    node_b = cluster.nodes["b"]
    t_stop = now()

    # 4. A's sessions continue on B through nginx, restored from the shared snapshots.
    rows = []
    for c in a_chats:
        rep = ok(c.ask(cluster.port), "%s#3 after node a stopped" % c.id)
        assert cluster.served_by(c)[-1] == "b", cluster.served_by(c)
        restored = [l for l in node_b.proxy.log_lines()
                    if l.time >= t_stop and l.event == "kv.session.restore.success"
                    and l.fields.get("session") == cluster.short(c)]
        assert len(restored) == 1, "%s was not restored on node b: %s" % (c.id, node_b.logged(cluster.short(c)))
        need = REUSE * c.first_prompt
        assert rep.cache_n is not None and rep.cache_n >= need, "%s: cache_n=%s < %.0f; %s" % (
            c.id, rep.cache_n, need, rep.describe())
        rows.append("%s (was on a) on b: restored %s tokens, cache_n=%d of prompt %d (%.1f%% of first prompt %d)" % (
            cluster.short(c), restored[0].fields.get("tokens"), rep.cache_n, rep.prompt_tokens,
            100.0 * rep.cache_n / c.first_prompt, c.first_prompt))
    # B's own sessions are unaffected (still on b, warm after a restore or resident).
    for c in b_chats:
        rep = ok(c.ask(cluster.port), "%s#3" % c.id)
        assert cluster.served_by(c) == ["b"] * 3
        assert rep.cache_n is not None and rep.cache_n >= REUSE * c.first_prompt, rep.describe()
    print("\nscale-out figures (%s):\n  sessions per node %s\n  %s" % (cluster.kind, counts, "\n  ".join(rows)))


def scaleout_on_new_cluster(tmp_path, kind: str, prompt_tokens: int):
    """run_scaleout on a fresh Cluster of this kind; a failure prints its diagnostics and the log
    tail of each real llama-server."""
    cluster = Cluster(tmp_path, kind)
    try:
        cluster.start()
        run_scaleout(cluster, prompt_tokens=prompt_tokens)
    except BaseException:
        print("\n==== diagnostics ====\n" + cluster.dump())
        for n in cluster.nodes.values():
            if isinstance(n.upstream, Llama):
                print("---- llama %s\n%s" % (n.name, n.upstream.log_tail(30)))
        raise
    finally:
        cluster.close()


@pytest.mark.fake_only
def test_scaleout_fake(tmp_path, nginx_ok, request):
    scaleout_on_new_cluster(tmp_path, "fake", 300)


@pytest.mark.real_only
def test_scaleout_real(tmp_path, nginx_ok, request):
    require_real_llama()
    scaleout_on_new_cluster(tmp_path, "real", 1000)


def test_shipped_nginx_config_is_valid(tmp_path, nginx_ok):
    """docker/nginx-scaleout.conf parses (with loopback upstreams) and uses consistent hashing
    on the session header, unbuffered proxying and HTTP/1.1 keep-alive upstreams."""
    n = Nginx(str(tmp_path), free_port(), [free_port(), free_port()])
    t = n.test_config()
    assert t.returncode == 0, t.stderr.decode()
    with open(os.path.join(REPO_ROOT, "docker", "nginx-scaleout.conf")) as f:
        conf = f.read()
    for directive in ("hash $http_x_session_id consistent;", "proxy_buffering off;",
                      "proxy_http_version 1.1;", 'proxy_set_header Connection "";', "keepalive "):
        assert directive in conf, directive
    assert "ring_hash" in conf.lower().replace("-", "_"), "the Envoy equivalent is documented"


def test_compose_example_is_consistent(tmp_path):
    """docker/compose.scaleout.yaml: both llama-servers run the same command (same fingerprint)
    on the shared `slots` volume, both kvpersist share `kvstate` and one config, nginx mounts the
    shipped config, and that embedded kvpersist config is accepted by the binary."""
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(REPO_ROOT, "docker", "compose.scaleout.yaml")) as f:
        d = yaml.safe_load(f)
    sv = d["services"]
    assert sv["llama-a"]["command"] == sv["llama-b"]["command"]
    assert "--slot-save-path /slots" in sv["llama-a"]["command"]
    assert "--no-cache-idle-slots" in sv["llama-a"]["command"]
    assert "slots:/slots" in sv["llama-a"]["volumes"] and "slots:/slots" in sv["llama-b"]["volumes"]
    for k in ("kvp-a", "kvp-b"):
        assert "kvstate:/var/lib/kvpersist" in sv[k]["volumes"], sv[k]
        assert sv[k]["entrypoint"] == sv["kvp-a"]["entrypoint"]
    assert sv["kvp-a"]["command"] == ["--upstream", "http://llama-a:8080"]
    assert sv["kvp-b"]["command"] == ["--upstream", "http://llama-b:8080"]
    assert "./nginx-scaleout.conf:/etc/nginx/nginx.conf:ro" in sv["nginx"]["volumes"]
    # Issue 36: the llama-servers take a key from a secret the kvpersists read too, on a
    # network nginx does not join.
    assert "--api-key-file /run/secrets/upstream-api-key" in sv["llama-a"]["command"]
    assert d["networks"]["llama"]["internal"] is True and "upstream-api-key" in d["secrets"]
    for k in ("llama-a", "llama-b", "kvp-a", "kvp-b"):
        assert "llama" in sv[k]["networks"] and sv[k]["secrets"] == ["upstream-api-key"], sv[k]
    assert sv["llama-a"]["networks"] == ["llama"] and "llama" not in sv["nginx"].get("networks", [])
    assert sv["kvp-a"]["environment"]["CREDENTIALS_DIRECTORY"] == "/run/secrets"
    # The embedded kvpersist config: the binary starts with it (upstream unreachable is fine).
    binary = kvpersist_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("no kvpersist binary")
    cfg = os.path.join(str(tmp_path), "scaleout.yaml")
    with open(cfg, "w") as f:
        f.write(d["configs"]["kvpersist"]["content"])
    p = KvPersist("http://127.0.0.1:9", os.path.join(str(tmp_path), "state"),
                  extra_args=["--config", cfg], work_dir=str(tmp_path))
    p.start()
    # kvpersist installs its SIGTERM handler just after it logs kv.proxy.listening (proxy/tools/main.cpp):
    # a SIGTERM sent the instant that line appears kills it (rc -15). Give it a moment.
    assert p.wait_for_log(r"kv\.backend\.unavailable", 5), p.log_text()
    time.sleep(0.2)
    assert p.stop(signal.SIGTERM, timeout=15) == 0, p.log_text()


@pytest.mark.fake_only
def test_shared_state_save_never_overwrites_the_generation_the_manifest_points_at(tmp_path):
    """Two nodes (no nginx needed): S on node A (saved, gen a), then on node B (restored,
    saved: gen b current), then back on node A, where S is still resident. A's next save must
    not write the file the on-disk manifest points at."""
    save_dir = os.path.join(str(tmp_path), "slots")
    state = os.path.join(str(tmp_path), "state")
    os.makedirs(save_dir)
    fa = fake_llama.FakeLlamaServer(save_dir).start()
    fb = fake_llama.FakeLlamaServer(save_dir).start()
    cfg = {"instanceKey": INSTANCE, "checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0,
           "snapshots": {"management": "shared-filesystem", "path": save_dir}}
    proxies = []
    try:
        pa = start_proxy(fa.url, state, os.path.join(str(tmp_path), "a"), cfg, runtime_key=RUNTIME_KEY)
        proxies.append(pa)
        pb = start_proxy(fb.url, state, os.path.join(str(tmp_path), "b"), cfg, runtime_key=RUNTIME_KEY)
        proxies.append(pb)
        s = Chat(fa.port, "gen", 50)
        ok(s.ask(pa.port), "S on A")
        assert pa.admin("POST", "/kv/flush").status == 200               # A saves S: gen a
        ok(s.ask(pb.port), "S on B")                                      # B restores a
        assert pb.admin("POST", "/kv/flush").status == 200               # B saves S: gen b
        m = manifest_for(state, s.id)
        assert m["snapshotFile"].endswith(".b.bin"), m
        ok(s.ask(pa.port), "S back on A (still resident there)")
        before = manifest_for(state, s.id)["snapshotFile"]
        assert pa.admin("POST", "/kv/flush").status == 200
        (save,) = [x for x in fa.management_calls() if x["action"] == "save"][1:]
        assert save["filename"] != before, \
            "node A wrote %s, the generation the manifest pointed at" % save["filename"]
    finally:
        for p in proxies:
            p.stop(signal.SIGKILL, timeout=5)
        fa.stop()
        fb.stop()


def test_sigterm_right_after_listening_is_a_clean_shutdown(tmp_path):
    binary = kvpersist_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("no kvpersist binary")
    import subprocess
    rcs = []
    for i in range(10):
        p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9",
                              "--state-dir", os.path.join(str(tmp_path), "state"), "--admin-listen", ""],
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        deadline = now() + 10
        for line in p.stderr:
            if b"kv.proxy.listening" in line:
                p.send_signal(signal.SIGTERM)
                break
            if now() > deadline:
                break
        try:
            rcs.append(p.wait(10))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append("hung")
    assert rcs == [0] * 10, rcs
