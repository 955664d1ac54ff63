// An outside team's agent in Node.js (18+, plain `fetch`, no package): it trains a streamrft run
// through the rollout gateway, as examples/agents/openai_agent.py does in Python.
//
// It plays guess-the-number (secret 1-8, at most 4 guesses; "higher:", "lower:", "invalid:") against
// the policy behind the gateway's OpenAI-compatible /v1/completions. Each round plays --groups secrets,
// --group-size episodes each, concurrently; every call names its episode and group in headers, and
// each episode ends with a POST of its reward to /v1/episodes/{id}/finish. The gateway publishes each
// full group, with the exact sampled tokens and log-probs, to the team's rollouts topic.
//
//   STREAMRFT_AGENTS_KEY=sk-agents-demo node examples/agents/agent.mjs --base-url http://127.0.0.1:8000/v1 --rounds 3
import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";

const LOW = 1, HIGH = 8, MAX_GUESSES = 4, TURN_PENALTY = 0.05;

const { values: args } = parseArgs({
  options: {
    "base-url": { type: "string", default: "http://127.0.0.1:8000/v1" },
    "api-key": { type: "string", default: process.env.STREAMRFT_AGENTS_KEY ?? "" },
    model: { type: "string", default: "policy" },
    groups: { type: "string", default: "2" },
    "group-size": { type: "string", default: "8" },
    rounds: { type: "string", default: "1" },
    "wait-minutes": { type: "string", default: "15" },
  },
});
if (!args["api-key"]) throw new Error("no key: pass --api-key or set STREAMRFT_AGENTS_KEY");
const base = args["base-url"].replace(/\/$/, "");
const groupSize = Number(args["group-size"]);

// POST JSON; waits out 429 (admission control) and 503 (group not acknowledged yet) as Retry-After says
async function post(path, body, headers = {}) {
  for (let attempt = 0; attempt < 100; attempt++) {
    const res = await fetch(base + path, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${args["api-key"]}`, ...headers },
      body: JSON.stringify(body),
    });
    if (res.status === 429 || res.status === 503) {
      await new Promise((r) => setTimeout(r, 1000 * Number(res.headers.get("retry-after") ?? 1)));
      continue;
    }
    const json = await res.json();
    if (!res.ok) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  }
  throw new Error(`${path}: still refused after 100 tries`);
}

// one game: the prompt of each call is the whole game so far, as text
async function play(secret, headers) {
  let prompt = `guess ${LOW}-${HIGH}:`;
  for (let guessNo = 1; guessNo <= MAX_GUESSES; guessNo++) {
    const out = await post("/completions", { model: args.model, prompt, max_tokens: 4, temperature: 1.0 }, headers);
    const choice = out.choices[0];
    if (choice.finish_reason !== "stop") return 0; // a cut-off answer is never played
    const text = choice.text.trim();
    const guess = /^-?\d{1,9}$/.test(text) ? Number(text) : null;
    if (guess === secret) return Math.max(0, 1 - TURN_PENALTY * (guessNo - 1));
    if (guessNo === MAX_GUESSES) return 0;
    prompt += choice.text + (guess === null ? "invalid:" : secret > guess ? "higher:" : "lower:");
  }
  return 0;
}

// until the gateway answers /health (no key needed): a run prepares and warms up its model first
async function waitHealthy(minutes) {
  const root = base.replace(/\/v1$/, ""), deadline = Date.now() + minutes * 60_000;
  let said = false;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(`${root}/health`)).ok) return true;
    } catch {} // not serving yet
    if (!said) console.log(`agent.mjs: waiting for the gateway at ${root} (a run prepares and warms up its model first)`);
    said = true;
    await new Promise((r) => setTimeout(r, 2000));
  }
  return false;
}

if (!(await waitHealthy(Number(args["wait-minutes"])))) {
  console.log(`agent.mjs: no gateway answered at ${base} within ${args["wait-minutes"]} minutes`);
  process.exit(1);
}
for (let round = 1; round <= Number(args.rounds); round++) {
  const games = [];
  for (let g = 0; g < Number(args.groups); g++) {
    const secret = LOW + Math.floor(Math.random() * (HIGH - LOW + 1));
    const group = randomUUID();
    for (let e = 0; e < groupSize; e++) {
      const headers = { "X-Episode-Id": randomUUID(), "X-Group-Id": group, "X-Group-Size": String(groupSize) };
      games.push(play(secret, headers).then(async (reward) => {
        const done = await post(`/episodes/${headers["X-Episode-Id"]}/finish`, { reward, task_id: `secret-${secret}-${group}` });
        return { reward, done };
      }));
    }
  }
  const results = await Promise.all(games);
  const published = new Set(results.filter((r) => r.done.status === "published").map((r) => r.done.group_id));
  const mean = results.reduce((s, r) => s + r.reward, 0) / results.length;
  console.log(`agent.mjs: round ${round}: train reward ${mean.toFixed(3)}, groups published ${published.size}: ${[...published].join(" ")}`);
}
