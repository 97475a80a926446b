"""kvptest: the Python helpers of kvpersist's integration tests (tests/integration), benchmarks
(bench/) and demo (scripts/demo.py), in one package. Test modules import helpers from here,
never from another test module.

Importing: tests/ is on the path the standard way. pytest reads `pythonpath = ..` from
tests/integration/pytest.ini; bench/run.sh and scripts/run.sh export PYTHONPATH=<repo>/tests; a
script run by hand needs the same (`PYTHONPATH=tests /usr/bin/python3 bench/switch.py ...`).

For scripts too (standard library plus PyYAML, python3-yaml; no pytest):
* identity:    session_hash() (core/identity.cpp), abbrev(), FAKE_MODEL, sid_factory(), sid()
* checks:      acts(), ok(), settled_calls(): the assertions most scenario tests share
* config:      to_yaml() (yaml.safe_dump), write_config(), deep_merge(), env_config()
* reply:       Reply and parse_reply(): a chat completion, streamed or not, checked
* prometheus:  parse_prometheus() (strict, text format 0.0.4), value(), flat_metrics() (lax)
* logs:        parse_log_line(): kvpersist's log lines (plain or JSON) as LogLine
* llama:       llama_server_cmd(), BAN_BYTE_TOKENS, prompt_tasks() (prompt and cached tokens per
               task from a `-lv 4` log)
* relay:       RecordingRelay (a TCP relay that keeps both directions), Exchange, usage_of()
* agents:      the agent CLIs of scripts/harnesses.sh (Claude Code, Codex CLI, OpenCode): config,
               environment, commands, run_cli()
* net:         HOST, free_port(), raw_exchange()
* procs:       tail() of a log file, stop_process(), die_with_parent()
* units:       parse_unit(), directive(): systemd unit files
* prompt_text: pseudo_text(), sized_text(): deterministic prompts of a given token count
* paths:       REPO_ROOT, kvpersist_bin() (KVPERSIST_BIN, default <repo>/build/kvpersist)
* waiting:     now (the fake's clock), wait_until(), wait_quiet(), Async (a call in a thread)
* http_client: http_request() on raw sockets (SSE events with arrival times, Expect:
               100-continue, dropping the connection), Response, KeepAliveClient
* kvpersist_process: KvPersist, the binary under test as a process (log lines, admin API)
* chat:        Conversation (agent-style history per session), Chat (long prompts on a real
               llama-server), chat_body(), make_text(), cached_tokens(), cache_n(), is_warm()
* manifests:   manifests(), manifest_for(), check_manifests_trustworthy()
* upstreams:   FakeUpstream / RealUpstream / RealUpstreamView behind one interface (Call,
               take_calls(), settle())
* fake_llama:  FakeLlamaServer, the in-process fake llama-server (also a script:
               `python3 -m kvptest.fake_llama --port N --slot-save-path DIR`); preset("defaults")
               for llama-server's own defaults
* fake_prompt_cache: PromptCache, the fake's model of llama-server's RAM prompt cache
* fake_router: FakeRouter, a fake llama-server router of FakeLlamaServer children
* messages_client: MessagesConversation, a Claude Code-like /v1/messages session
* dashboard_client: the admin API's event stream and headless Chromium for the dashboard
* admin_client: the admin API and the CLI: idle(), scrape(), admin_addr(), run_cli(), JsonKvPersist
* api_run:     ApiConversation (chat, Responses or Messages), reuse_run() (a run in the three API
               families, each response's reuse with its source), counted_reuse()

For the tests only (they import pytest, for skips and fixtures):
* stack:       Stack, one test's upstream and kvpersist processes (the `stack` fixture)
* multislot_helpers: start_proxy(), FakeWorld, Llama (-np N), CallTaker, Nginx
* real_world:  the module-scoped real llama-server fixtures (llama, world, module_llama) and
               the Node client drivers
* stall_fs:    Stall, a preloaded shim (tests/support/stall_fs.c) whose fsyncs hang on demand
"""
