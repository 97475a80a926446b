// switch.mjs - an agent-harness-style session switch through kvpersist with the official
// OpenAI Node client: session A, session B, session A again, each a streamed chat completion
// with stream_options.include_usage. Prints one JSON object on stdout:
//   {"openai_version": "...", "turns": [{label, session, content, chunks, finish_reason,
//     ttft_ms, prompt_tokens, completion_tokens, cache_n, prompt_n}, ...]}
// cache_n/prompt_n come from llama-server's `timings` on the final (usage) chunk.
//
// Usage: node switch.mjs SCENARIO.json
//   SCENARIO.json: {"baseURL": "http://127.0.0.1:PORT/v1",
//                   "sessions": {"A": "...", "B": "..."},
//                   "system": {"A": "...", "B": "..."},      (long prompts, one per session)
//                   "max_tokens": 8, "seed": 1, "timeout_ms": 60000}
// Used by tests/integration/test_acceptance_real.py::test_openai_node_client_switch.
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { VERSION } from "openai/version";

const scenario = JSON.parse(readFileSync(process.argv[2], "utf8"));

// The random-weight test model can end on a lone byte token (ids 3..258), which llama-server's
// chat parser rejects; ban them (an OpenAI-style logit_bias map). Real models do not need it.
const logitBias = {};
for (let id = 3; id <= 258; id++) logitBias[String(id)] = -100;

function client(session) {
  return new OpenAI({
    baseURL: scenario.baseURL,
    apiKey: "none",
    defaultHeaders: { "X-Session-Id": session },
    timeout: scenario.timeout_ms ?? 60000,
    maxRetries: 0,
  });
}

const clients = { A: client(scenario.sessions.A), B: client(scenario.sessions.B) };
const history = {
  A: [{ role: "system", content: scenario.system.A }],
  B: [{ role: "system", content: scenario.system.B }],
};

async function turn(label, key, userText) {
  const messages = [...history[key], { role: "user", content: userText }];
  const t0 = performance.now();
  const stream = await clients[key].chat.completions.create({
    model: "test",
    messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: scenario.max_tokens ?? 8,
    temperature: 0,
    seed: scenario.seed ?? 1,
    logit_bias: logitBias,
  });
  let content = "";
  let chunks = 0;
  let ttft = null;
  let finish = null;
  let usage = null;
  let timings = null;
  for await (const chunk of stream) {
    chunks++;
    for (const choice of chunk.choices ?? []) {
      const piece = choice.delta?.content;
      if (piece) {
        if (ttft === null) ttft = performance.now() - t0;
        content += piece;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
    if (chunk.timings) timings = chunk.timings;
  }
  history[key] = [...messages, { role: "assistant", content }];
  return {
    label,
    session: scenario.sessions[key],
    content,
    chunks,
    finish_reason: finish,
    ttft_ms: ttft,
    total_ms: performance.now() - t0,
    prompt_tokens: usage?.prompt_tokens ?? null,
    completion_tokens: usage?.completion_tokens ?? null,
    cached_tokens: usage?.prompt_tokens_details?.cached_tokens ?? null,
    cache_n: timings?.cache_n ?? null,
    prompt_n: timings?.prompt_n ?? null,
  };
}

try {
  const turns = [];
  turns.push(await turn("A1", "A", "Summarise the notes above in one line."));
  turns.push(await turn("B1", "B", "Summarise the notes above in one line."));
  turns.push(await turn("A2", "A", "Thanks. Now list the three most frequent words."));
  console.log(JSON.stringify({ openai_version: VERSION, turns }));
} catch (err) {
  console.log(JSON.stringify({ error: String(err?.stack ?? err), status: err?.status ?? null }));
  process.exit(1);
}
