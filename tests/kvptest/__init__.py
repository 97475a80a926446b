"""kvptest: the Python helpers shared by kvpersist's integration tests (tests/integration),
benchmarks (bench/) and demo (scripts/demo.py). Standard library plus PyYAML (python3-yaml);
no pytest and no harness, so a script can import any module here.

* identity:   session_hash() (core/identity.cpp), abbrev(), FAKE_MODEL, sid_factory(), sid()
* checks:     acts(), ok(), settled_calls(): the assertions most scenario tests share
* config:     to_yaml() (yaml.safe_dump) and write_config() for kvpersist's config file
* reply:      Reply and parse_reply(): a chat completion, streamed or not, checked
* prometheus: parse_prometheus() (strict, text format 0.0.4), value(), flat_metrics() (lax)
* logs:       parse_log_line(): kvpersist's log lines (plain or JSON) as LogLine
* llama:      llama_server_cmd(), BAN_BYTE_TOKENS, prompt_tasks() (prompt and cached tokens per task
              from a `-lv 4` log)
* relay:      RecordingRelay (a TCP relay that keeps both directions), Exchange, usage_of()
* agents:     the agent CLIs of scripts/harnesses.sh (Claude Code, Codex CLI, OpenCode): config,
              environment, commands, run_cli()
* net:        free_port(), raw_exchange()
* procs:      tail() of a log file, stop_process(), die_with_parent()
* units:      parse_unit(), directive(): systemd unit files

Importing: tests/integration/conftest.py and harness.py put tests/ on sys.path; bench/lib.py and
scripts/demo.py do the same (`sys.path.insert(1, <repo>/tests)`).
"""
