"""pytest plugin that runs llama.cpp's server tests (tools/server/tests) offline, direct or
through kvpersist. scripts/llama-suite.sh loads it with `-p kvp_suite_plugin` from a copy of
the test directory; the llama.cpp tree itself is never modified. docs/llama-suite.md has the
whole picture.

What it changes in the suite's `utils` module (imported here before the suite's conftest.py):
- ServerPreset.load_all() downloads nothing (there is no network here).
- ServerProcess.start() replaces each Hugging Face model by a local random-weight GGUF
  (KVP_SUITE_MODEL_LLAMA / _MOE, made by scripts/test-model.sh), with --chat-template chatml
  where the test asks for no template and no Jinja (see use_local_model).
- With KVP_SUITE_VARIANT=passthrough or managed, each llama-server starts on a free port and
  a kvpersist (KVP_SUITE_KVPERSIST) listens on the port the test talks to:
    passthrough: llama-server unchanged (no --slot-save-path), so kvpersist forwards with
                 persistence off;
    managed:     llama-server also gets --slot-save-path (unless the test sets one) and
                 kvpersist runs single-slot for -np 1, managed-slots otherwise, so it saves,
                 restores and erases slots around the tests' requests.
  stop() stops kvpersist (SIGTERM, it checkpoints) before llama-server.
Per-test llama-server and kvpersist logs go to KVP_SUITE_LOGDIR.
"""

import os
import re
import socket
import subprocess
import tempfile
import time

# The suite's own module, the one its conftest.py imports: the copied tools/server/tests
# directory is the working directory and on PYTHONPATH (scripts/llama-suite.sh).
import utils

VARIANT = os.environ.get("KVP_SUITE_VARIANT", "direct")
KVPERSIST_BIN = os.environ.get("KVP_SUITE_KVPERSIST", "")
LOG_DIR = os.environ.get("KVP_SUITE_LOGDIR", tempfile.gettempdir())
SCRATCH_DIR = os.environ.get("KVP_SUITE_SCRATCH")  # state and slot dirs; None: the system temp dir
MODELS = {
    "llama": os.environ["KVP_SUITE_MODEL_LLAMA"],
    "moe": os.environ.get("KVP_SUITE_MODEL_MOE") or os.environ["KVP_SUITE_MODEL_LLAMA"],
}
KVPERSIST_START_TIMEOUT_S = 30
KVPERSIST_STOP_TIMEOUT_S = 15


def local_model_for(hf_repo, hf_file):
    """The local GGUF standing in for a Hugging Face model of the suite's presets."""
    name = f"{hf_repo or ''}/{hf_file or ''}".lower()
    if "moe" in name:
        return MODELS["moe"]
    return MODELS["llama"]  # stories260K, tinygemma3 (no mmproj here), bert/jina, the big slow ones


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def current_test_slug():
    test = os.environ.get("PYTEST_CURRENT_TEST", "no-test").split(" ")[0]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", test)[:180]


def use_local_model(server):
    if server.model_hf_repo or server.model_hf_file or server.model_url:
        server.model_file = local_model_for(server.model_hf_repo, server.model_hf_file or server.model_url)
        server.model_hf_repo = None
        server.model_hf_file = None
        server.model_url = None
    # The suite's stories260K models carry no chat template, so llama-server falls back to
    # chatml; the local models carry a Jinja-only one (scripts/make-test-model.py), which
    # --no-jinja (the suite's default) refuses. Name chatml the same way, router included.
    if not (server.jinja or server.chat_template or server.chat_template_file):
        server.chat_template = "chatml"


def write_kvpersist_config(server, llama_port, listen_port, state_dir):
    managed = VARIANT == "managed"
    mode = "single-slot" if (server.n_slots == 1 or not managed) else "managed-slots"
    lines = [
        f'listen: "127.0.0.1:{listen_port}"',
        "upstream:",
        f'  url: "http://127.0.0.1:{llama_port}"',
    ]
    if server.sleep_idle_seconds:
        lines.append(f"  sleepIdleSeconds: {server.sleep_idle_seconds}")
    lines += [
        f"mode: {mode}",
        f'stateDir: "{state_dir}"',
        "admin:",
        '  listen: ""',
        "log:",
        "  level: debug",
    ]
    path = os.path.join(state_dir, "kvpersist.yaml")
    with open(path, "w") as config:
        config.write("\n".join(lines) + "\n")
    return path


def wait_for_kvpersist(server, process, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kvpersist exited with {process.returncode} (log in {LOG_DIR})")
        try:
            headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else None
            if server.make_request("GET", "/health", headers=headers, timeout=2).status_code == 200:
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"kvpersist did not answer /health within {timeout_s} s")


def start_kvpersist(server, llama_port):
    state_dir = tempfile.mkdtemp(prefix="kvp-suite-state-", dir=SCRATCH_DIR)
    config = write_kvpersist_config(server, llama_port, server.server_port, state_dir)
    env = dict(os.environ)
    if server.api_key:
        env["KVP_UPSTREAM_API_KEY"] = server.api_key
    server._kvp_log = open(os.path.join(LOG_DIR, current_test_slug() + ".kvpersist.log"), "a")
    server._kvp_process = subprocess.Popen(
        [KVPERSIST_BIN, "serve", "--config", config],
        stdout=server._kvp_log, stderr=subprocess.STDOUT, env=env)
    wait_for_kvpersist(server, server._kvp_process, KVPERSIST_START_TIMEOUT_S)


def stop_kvpersist(server):
    process = getattr(server, "_kvp_process", None)
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=KVPERSIST_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
    server._kvp_process = None
    server._kvp_log.close()


original_start = utils.ServerProcess.start
original_stop = utils.ServerProcess.stop


def start(self, timeout_seconds=utils.DEFAULT_HTTP_TIMEOUT):
    use_local_model(self)
    if self.log_path is None:
        self.log_path = os.path.join(LOG_DIR, current_test_slug() + ".llama.log")
    if VARIANT == "direct" or self.external_server:
        return original_start(self, timeout_seconds)
    if VARIANT == "managed" and not self.slot_save_path:
        self.slot_save_path = tempfile.mkdtemp(prefix="kvp-suite-slots-", dir=SCRATCH_DIR)
    listen_port = self.server_port
    llama_port = free_port()
    self.server_port = llama_port
    try:
        original_start(self, timeout_seconds)
    finally:
        self.server_port = listen_port
    try:
        start_kvpersist(self, llama_port)
    except Exception:
        stop(self)
        raise


def stop(self):
    stop_kvpersist(self)
    original_stop(self)


if VARIANT not in ("direct", "passthrough", "managed"):
    raise SystemExit(f"KVP_SUITE_VARIANT={VARIANT}: expected direct, passthrough or managed")
if VARIANT != "direct" and not os.access(KVPERSIST_BIN, os.X_OK):
    raise SystemExit(f"KVP_SUITE_KVPERSIST={KVPERSIST_BIN!r} is not an executable")
utils.ServerPreset.load_all = staticmethod(lambda: None)
utils.ServerProcess.start = start
utils.ServerProcess.stop = stop
