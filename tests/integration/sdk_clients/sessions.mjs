// sessions.mjs - an agent-harness-style session switch through kvpersist with an official
// client library: session A, session B, session A again (the whole history resent each turn),
// on one of three APIs, streamed or not. Prints one JSON object on stdout:
//   {"sdk": "openai@5.23.2", "turns": [{label, session, content, prompt_tokens, cached_tokens,
//     finish_reason}, ...]}
// prompt_tokens is the whole prompt, cached_tokens the part llama-server reused, both read
// from the SDK's usage object in the API's own fields.
//
// Usage: node sessions.mjs SCENARIO.json
//   SCENARIO.json: {"api": "chat" | "responses" | "messages", "stream": true | false,
//                   "baseURL": "http://127.0.0.1:PORT",          (no /v1: each client adds it)
//                   "sessions": {"A": "...", "B": "..."},
//                   "system": {"A": "...", "B": "..."},          (long prompts, one per session)
//                   "max_tokens": 8, "seed": 1, "timeout_ms": 60000}
// Used by tests/integration/test_client_sdks_real.py.
import { readFileSync } from "node:fs";
import Anthropic from "@anthropic-ai/sdk";
import { VERSION as ANTHROPIC_VERSION } from "@anthropic-ai/sdk/version";
import OpenAI from "openai";
import { VERSION as OPENAI_VERSION } from "openai/version";

const scenario = JSON.parse(readFileSync(process.argv[2], "utf8"));
const maxTokens = scenario.max_tokens ?? 8;

// The random-weight test model can end on a lone byte token (ids 3..258), which llama-server's
// chat parser rejects; ban them where the API passes logit_bias through (chat, responses; the
// Anthropic converter drops it, top_k 1 keeps that one greedy and deterministic).
const logitBias = {};
for (let id = 3; id <= 258; id++) logitBias[String(id)] = -100;

function options(session) {
  return { apiKey: "none", defaultHeaders: { "X-Session-Id": session },
           timeout: scenario.timeout_ms ?? 60000, maxRetries: 0 };
}

// Each API: a client per session, how a turn's history item looks, and one request that
// returns {content, prompt_tokens, cached_tokens, finish_reason}.
const apis = {
  chat: {
    sdk: `openai@${OPENAI_VERSION}`,
    client: (s) => new OpenAI({ baseURL: `${scenario.baseURL}/v1`, ...options(s) }),
    assistant: (content) => ({ role: "assistant", content }),
    async ask(client, system, history) {
      const body = { model: "test", messages: [{ role: "system", content: system }, ...history],
                     max_tokens: maxTokens, temperature: 0, seed: scenario.seed ?? 1, logit_bias: logitBias };
      if (!scenario.stream) {
        const r = await client.chat.completions.create(body);
        return { content: r.choices[0].message.content, finish_reason: r.choices[0].finish_reason,
                 ...chatUsage(r.usage) };
      }
      const stream = await client.chat.completions.create(
        { ...body, stream: true, stream_options: { include_usage: true } });
      let content = "", finish = null, usage = null;
      for await (const chunk of stream) {
        for (const c of chunk.choices ?? []) {
          content += c.delta?.content ?? "";
          finish = c.finish_reason ?? finish;
        }
        usage = chunk.usage ?? usage;
      }
      return { content, finish_reason: finish, ...chatUsage(usage) };
    },
  },
  responses: {
    sdk: `openai@${OPENAI_VERSION}`,
    client: (s) => new OpenAI({ baseURL: `${scenario.baseURL}/v1`, ...options(s) }),
    assistant: (content) => ({ type: "message", role: "assistant", content }),
    async ask(client, system, history) {
      const body = { model: "test", instructions: system, input: history, max_output_tokens: maxTokens,
                     temperature: 0, seed: scenario.seed ?? 1, logit_bias: logitBias };
      let r;
      if (!scenario.stream) {
        r = await client.responses.create(body);
      } else {
        const stream = await client.responses.create({ ...body, stream: true });
        let deltas = "";
        for await (const event of stream) {
          if (event.type === "response.output_text.delta") deltas += event.delta;
          if (event.type === "response.completed") r = event.response;
        }
        if (outputText(r) !== deltas) {
          throw new Error(`streamed ${JSON.stringify(deltas)} != final ${JSON.stringify(outputText(r))}`);
        }
      }
      return { content: outputText(r), finish_reason: r.status, prompt_tokens: r.usage.input_tokens,
               cached_tokens: r.usage.input_tokens_details?.cached_tokens ?? null };
    },
  },
  messages: {
    sdk: `@anthropic-ai/sdk@${ANTHROPIC_VERSION}`,
    client: (s) => new Anthropic({ baseURL: scenario.baseURL, ...options(s) }),
    assistant: (content) => ({ role: "assistant", content }),
    async ask(client, system, history) {
      const body = { model: "test", system, messages: history, max_tokens: maxTokens, temperature: 0, top_k: 1 };
      let m;
      if (!scenario.stream) {
        m = await client.messages.create(body);
      } else {
        const stream = client.messages.stream(body);
        let deltas = "";
        stream.on("text", (t) => { deltas += t; });
        m = await stream.finalMessage();
        if (text(m) !== deltas) throw new Error(`streamed ${JSON.stringify(deltas)} != final ${JSON.stringify(text(m))}`);
      }
      // Anthropic's input_tokens excludes the part read from the cache.
      const cached = m.usage.cache_read_input_tokens ?? 0;
      return { content: text(m), finish_reason: m.stop_reason, prompt_tokens: m.usage.input_tokens + cached,
               cached_tokens: m.usage.cache_read_input_tokens ?? null };
    },
  },
};

function chatUsage(usage) {
  return { prompt_tokens: usage?.prompt_tokens ?? null,
           cached_tokens: usage?.prompt_tokens_details?.cached_tokens ?? null };
}

// The text of a Responses API response (the SDK's output_text exists only on non-streamed ones).
function outputText(response) {
  return response.output.filter((o) => o.type === "message").flatMap((o) => o.content)
    .filter((c) => c.type === "output_text").map((c) => c.text).join("");
}

function text(message) {
  return message.content.filter((b) => b.type === "text").map((b) => b.text).join("");
}

const api = apis[scenario.api];
if (!api) throw new Error(`unknown api ${scenario.api}`);
const clients = { A: api.client(scenario.sessions.A), B: api.client(scenario.sessions.B) };
const history = { A: [], B: [] };

async function turn(label, key, userText) {
  const asked = [...history[key], { role: "user", content: userText }];
  const r = await api.ask(clients[key], scenario.system[key], asked);
  history[key] = [...asked, api.assistant(r.content)];
  return { label, session: scenario.sessions[key], ...r };
}

try {
  const turns = [];
  turns.push(await turn("A1", "A", "Summarise the notes above in one line."));
  turns.push(await turn("B1", "B", "Summarise the notes above in one line."));
  turns.push(await turn("A2", "A", "Thanks. Now list the three most frequent words."));
  console.log(JSON.stringify({ sdk: api.sdk, turns }));
} catch (err) {
  console.log(JSON.stringify({ error: String(err?.stack ?? err), status: err?.status ?? null }));
  process.exit(1);
}
