"""A fake llama-server router (docs/llama-server.md §14) for exact call sequences: children are
FakeLlamaServer processes-in-a-thread started on demand, one per model, sharing one slot save
directory; at most `max_instances` run, and starting another first stops the least recently
used idle one (every POST counts as a use), which loses its KV. Requests pick their model by
the body's "model" (POST, read as llama-server's JSON parser reads it: up to a NUL byte, past a
UTF-8 BOM) or ?model= (GET, the query as llama-server reads it: keys decoded too, the last
of repeated keys); `autoload` as the router's. With `api_key`, a request without it gets
401 (docs/llama-server.md §8). A load takes `load_delay_s`, and is dropped when the client
of the request that made it leaves meanwhile (llama-server drops a queued one so).

Everything the router was asked is in `requests` (method, path, query, model), in order.
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvptest.fake_llama import FakeLlamaServer, err_body, httplib_split_target, peer_closed


def nlohmann_text(body: bytes) -> bytes:
    """The JSON text llama-server's parser (nlohmann::json) reads of `body`: a leading UTF-8
    BOM skipped, and nothing from the first NUL byte on (it takes a NUL for the end of input)."""
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]
    return body.split(b"\0", 1)[0]


def httplib_query(raw_query: str) -> dict[str, str]:
    """llama-server's get_param of a query (docs/llama-server.md §9): keys and values decoded
    ('+' a space), a pair repeated verbatim read once, the last of repeated keys."""
    pairs = list(dict.fromkeys(p for p in raw_query.split("&") if p))
    return dict(urllib.parse.parse_qsl("&".join(pairs), keep_blank_values=True))


class FakeRouter:
    def __init__(self, slot_save_path: str, models: dict[str, list[str]], max_instances: int = 1,
                 autoload: bool = True, api_key: str = "", load_delay_s: float = 0.0):
        """`models`: model id -> its aliases."""
        self.slot_save_path = slot_save_path
        self.models = models
        self.max_instances = max_instances
        self.autoload = autoload
        self.api_key = api_key
        self.load_delay_s = load_delay_s
        self.dropped_loads: list[str] = []
        self.children: dict[str, FakeLlamaServer] = {}   # the running ones
        self.last_used: dict[str, int] = {}
        self.busy: dict[str, int] = {}
        self.requests: list[dict] = []
        self.unloads: list[str] = []
        self._clock = itertools.count(1)
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def start(self):
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _RouterHandler)
        self._httpd.daemon_threads = True
        self._httpd.router = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self):
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
        with self._lock:
            for c in self.children.values():
                c.stop()
            self.children.clear()

    # ------------------------------------------------------------------ models
    def resolve(self, name: str) -> str | None:
        for m, aliases in self.models.items():
            if name == m or name in aliases:
                return m
        return None

    def load(self, model: str, client_gone=lambda: False) -> bool:
        """Starts `model`'s child, first stopping the least recently used idle one at capacity;
        False (nothing started) when `client_gone` says so during the load's delay."""
        deadline = time.monotonic() + self.load_delay_s
        while time.monotonic() < deadline:
            if client_gone():
                self.dropped_loads.append(model)
                return False
            time.sleep(0.02)
        with self._lock:
            if model in self.children:
                return True
            if self.max_instances and len(self.children) >= self.max_instances:
                idle = [m for m in self.children if not self.busy.get(m)]
                victim = min(idle, key=lambda m: self.last_used.get(m, 0))
                self.children.pop(victim).stop()
                self.unloads.append(victim)
            child = FakeLlamaServer(self.slot_save_path, model_path="/models/%s.gguf" % model)
            child.weights_seed = sorted(self.models).index(model)
            self.children[model] = child.start()
            return True

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self.children)

    def child(self, model: str) -> FakeLlamaServer | None:
        with self._lock:
            return self.children.get(model)

    def calls(self, *, kvpersist_only: bool = False) -> list[tuple]:
        """(method, path, model) of every request, in order."""
        return [(r["method"], r["path"], r["model"]) for r in self.requests]


class _RouterHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    @property
    def router(self) -> FakeRouter:
        return self.server.router  # type: ignore[attr-defined]

    def _send(self, status: int, body: bytes, content_type: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj):
        self._send(status, json.dumps(obj).encode())

    def _client_gone(self) -> bool:
        return peer_closed(self.connection)

    def _key_refused(self) -> bool:
        key = self.headers.get("Authorization") or self.headers.get("X-Api-Key") or ""
        return bool(self.router.api_key) and key.removeprefix("Bearer ") != self.router.api_key

    def _dispatch(self):
        r = self.router
        path, raw_query = httplib_split_target(self.path)
        query = httplib_query(raw_query)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        model = query.get("model", "")
        if path not in ("/health", "/v1/health") and self._key_refused():
            r.requests.append({"method": self.command, "path": path, "query": query, "model": None,
                               "refused": 401})
            return self._json(401, err_body(401, "Invalid API Key", "authentication_error"))
        if self.command == "POST":
            body = nlohmann_text(body)
            try:
                model = json.loads(body or b"").get("model", "")
            except (ValueError, AttributeError):
                # the router parses every POST body (nlohmann::json::parse throws on ""): a 500
                r.requests.append({"method": "POST", "path": path, "query": query, "model": None})
                return self._json(500, err_body(500, "parse error", "server_error"))
        r.requests.append({"method": self.command, "path": path, "query": query, "model": model or None})
        if path in ("/health", "/v1/health"):
            return self._json(200, {"status": "ok"})
        if self.command == "GET" and path == "/props" and not model:
            return self._json(200, {"role": "router", "max_instances": r.max_instances,
                                    "models_autoload": r.autoload, "model_path": "none",
                                    "build_info": "b1-fakerouter"})
        if self.command == "GET" and path in ("/v1/models", "/models"):
            running = r.running()
            return self._json(200, {"object": "list", "data": [
                {"id": m, "aliases": al, "object": "model",
                 "status": {"value": "loaded" if m in running else "unloaded", "args": []}}
                for m, al in r.models.items()]})
        if self.command == "POST" and path == "/models/load":
            target = r.resolve(model)
            if not target:
                return self._json(404, err_body(404, "model is not found", "not_found_error"))
            if target in r.running():
                return self._json(400, err_body(400, "model is already running", "invalid_request_error"))
            r.load(target)
            return self._json(200, {"success": True})
        if self.command == "POST" and path == "/models/unload":
            target = r.resolve(model)
            with r._lock:
                child = r.children.pop(target, None) if target else None
            if not child:
                return self._json(400, err_body(400, "model is not running", "invalid_request_error"))
            child.stop()
            r.unloads.append(target)
            return self._json(200, {"success": True})
        return self._proxy(path, query, body, model)

    def _proxy(self, path, query, body, model):
        r = self.router
        if not model:
            return self._json(400, err_body(400, "model name is missing from the request", "invalid_request_error"))
        target = r.resolve(model)
        if not target:
            return self._json(400, err_body(400, "model '%s' not found" % model, "invalid_request_error"))
        autoload = query.get("autoload", "true" if r.autoload else "false") in ("true", "1")
        if target not in r.running():
            if not autoload:
                return self._json(400, err_body(400, "model is not loaded", "invalid_request_error"))
            if not r.load(target, self._client_gone):
                self.close_connection = True
                return None
        child = r.child(target)
        with r._lock:
            if self.command == "POST":
                r.last_used[target] = next(r._clock)
            r.busy[target] = r.busy.get(target, 0) + 1
        try:
            conn = http.client.HTTPConnection("127.0.0.1", child.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
        finally:
            with r._lock:
                r.busy[target] -= 1
        self._send(resp.status, data, resp.getheader("Content-Type") or "application/json")

    do_GET = do_POST = lambda self: self._dispatch()  # noqa: E731
