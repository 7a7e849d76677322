// The Node client against a live server: FORMWORK_ADDR=host:port node --test clients/node/test/
// (tests/integration/test_node_client.py starts one and runs this; `make test` runs that). Light on tokens:
// the server may be a 2-core CPU machine.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer } from "node:net";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  chatMessage, choice, FormworkClient, FormworkError, IncompleteOutputError, jsonSchema, reasoning, regex, structuralTag,
  tool, ToolCallAccumulator, toolCalls, toolChoice,
} from "formwork-client";

const ADDRESS = process.env.FORMWORK_ADDR;
const PERSON_SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 20 },
    age: { type: "integer", minimum: 0, maximum: 150 },
  },
  required: ["name", "age"],
  additionalProperties: false,
};

/** The checks PERSON_SCHEMA makes, by hand (no JSON-Schema validator among the dependencies). */
function assertPerson(value) {
  assert.equal(typeof value, "object");
  assert.deepEqual(Object.keys(value).sort(), ["age", "name"]);
  assert.equal(typeof value.name, "string");
  assert.ok(value.name.length <= 20, value.name);
  assert.ok(Number.isInteger(value.age) && value.age >= 0 && value.age <= 150, String(value.age));
}

async function rejection(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("expected the call to fail");
}

async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port; // nothing listens on it now
}

describe("FormworkClient against a live server", () => {
  let client;

  before(() => {
    assert.ok(ADDRESS, "set FORMWORK_ADDR to the host:port of a running server (make serve: 127.0.0.1:50051)");
    client = new FormworkClient(ADDRESS, { timeoutMs: 120_000 });
  });

  after(() => client?.close());

  test("modelInfo: the model, limits and load", async () => {
    const info = await client.modelInfo();
    assert.equal(info.model_name, "SmolLM2-135M-Instruct");
    assert.ok(info.limits.max_tokens_cap >= 32);
    assert.ok(info.constraint_kinds.includes("json_schema"));
    assert.equal(typeof info.load.num_steps, "number");
  });

  test("extract returns an object the schema accepts", async () => {
    const person = await client.extract(PERSON_SCHEMA, "Ada Lovelace was 36 years old.", { maxTokens: 40 });
    assertPerson(person);
  });

  test("speculative: switched on per request, its draft counts in usage", async () => {
    assertPerson(await client.extract(PERSON_SCHEMA, "Ada Lovelace was 36 years old.", { maxTokens: 40, speculative: true }));
    const response = await client.generate({
      prompt: "one two three four five one two three four five one two three", max_tokens: 8, temperature: 0,
      speculative: true,
    });
    assert.ok(response.usage.draft_tokens > 0, JSON.stringify(response.usage)); // the text repeats: drafts
    assert.ok(response.usage.draft_tokens >= response.usage.accepted_draft_tokens);
  });

  test("generate with a choice constraint", async () => {
    const response = await client.generate({
      chat: { messages: [{ role: "user", content: "Is the sky blue? Answer yes or no." }] },
      max_tokens: 4, temperature: 0, constraint: choice(["yes", "no"]),
    });
    assert.ok(["yes", "no"].includes(response.text), response.text);
    assert.equal(response.finish_reason, "FINISH_REASON_STOP");
    assert.ok(response.usage.completion_tokens >= 1);
  });

  test("stream: deltas, then the totals on the last message", async () => {
    const messages = [];
    for await (const response of client.stream({ prompt: "The three primary colors are", max_tokens: 6, temperature: 0 })) {
      messages.push(response);
    }
    assert.ok(messages.length > 1);
    assert.ok(messages.slice(0, -1).every((m) => m.finish_reason === "FINISH_REASON_UNSPECIFIED"));
    const last = messages.at(-1);
    assert.ok(["FINISH_REASON_STOP", "FINISH_REASON_LENGTH"].includes(last.finish_reason));
    assert.equal(last.usage.completion_tokens, messages.reduce((n, m) => n + m.token_ids.length, 0));
  });

  test("tools: a required call, its arguments streamed, and the tools in Tokenize's count", async () => {
    const weather = { type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"] };
    const messages = [{ role: "user", content: "What is the weather in Paris?" }];
    const request = {
      chat: { messages }, tools: [tool("get_weather", weather, "Current weather in a city")],
      tool_choice: toolChoice("required"), parallel_tool_calls: false, max_tokens: 48, temperature: 0,
    };
    const [call, ...more] = toolCalls(await client.generate(request));
    assert.equal(more.length, 0);
    assert.equal(call.name, "get_weather");
    assert.equal(typeof call.arguments.city, "string");
    const accumulator = new ToolCallAccumulator();
    let last;
    for await (const response of client.stream(request)) {
      accumulator.add(response);
      last = response;
    }
    assert.deepEqual(accumulator.calls, last.tool_calls.map(({ id, name, arguments_json }) => ({ id, name, arguments_json })));
    const plain = await client.tokenize({ chat: { messages } });
    const withTools = await client.tokenize({ chat: { messages }, tools: request.tools });
    assert.ok(withTools.token_ids.length > plain.token_ids.length);
    assert.ok(withTools.rendered_prompt.includes("get_weather"));
  });

  test("allowed tools in OpenAI's shape: asked for the weather with only get_time allowed, it calls get_time", async () => {
    const time = { type: "object", properties: { zone: { type: "string", maxLength: 20 } }, required: ["zone"] };
    const weather = { type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"] };
    const tools = [tool("get_weather", weather, "Current weather in a city"), tool("get_time", time, "The time in a time zone")];
    const response = await client.generate({
      chat: { messages: [{ role: "user", content: "What is the weather in Paris?" }] }, tools, parallel_tool_calls: false,
      tool_choice: toolChoice({ type: "allowed_tools", allowed_tools: { mode: "required",
        tools: [{ type: "function", function: { name: "get_time" } }] } }),
      max_tokens: 48, temperature: 0,
    });
    const [call, ...more] = toolCalls(response);
    assert.equal(more.length, 0);
    assert.equal(call.name, "get_time");
    assert.equal(typeof call.arguments.zone, "string");
    assert.equal(response.content, ""); // only calls: no answer text beside them
    const error = await rejection(client.generate({ chat: { messages: [{ role: "user", content: "hi" }] }, tools,
      tool_choice: toolChoice({ allowed: ["get_date"] }), max_tokens: 8 }));
    assert.equal(error.code, "INVALID_ARGUMENT");
    assert.match(error.fieldViolations[0].field, /^tool_choice/);
  });

  test("chatMessage: an OpenAI-shaped call and its result render into the prompt", async () => {
    const messages = [
      { role: "user", content: "What is the weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
        function: { name: "get_weather", arguments: { city: "Paris" } } }] },
      { role: "tool", tool_call_id: "call_1", name: "get_weather", content: "18 degrees and sunny" },
    ].map(chatMessage);
    const tools = [tool("get_weather", { type: "object", properties: { city: { type: "string" } } })];
    const { rendered_prompt } = await client.tokenize({ chat: { messages }, tools });
    assert.ok(rendered_prompt.includes('"city": "Paris"') || rendered_prompt.includes('"city":"Paris"'), rendered_prompt);
    assert.ok(rendered_prompt.includes("18 degrees and sunny"), rendered_prompt);
  });

  test("reasoning: its fields reach the server, which names the one it cannot serve on a model without think markers", async () => {
    const ask = { chat: { messages: [{ role: "user", content: "Is the sky blue? Answer yes or no." }] }, max_tokens: 4,
      temperature: 0 };
    const think = await rejection(client.generate({ ...ask, reasoning: reasoning({ thinkConstraint: regex("[a-z ]+") }) }));
    assert.deepEqual(think.fieldViolations.map((v) => v.field), ["reasoning.think_constraint"]);
    assert.match(think.details, /no think markers/);
    const budget = await rejection(client.generate({ ...ask, reasoning: reasoning({ budgetTokens: 8 }) }));
    assert.deepEqual(budget.fieldViolations.map((v) => v.field), ["reasoning.budget_tokens"]);
    const whole = await rejection(client.generate({ ...ask, reasoning: reasoning({ constraintInReasoning: true }) }));
    assert.deepEqual(whole.fieldViolations.map((v) => v.field), ["reasoning.constraint_in_reasoning"]);
    assert.match(whole.details, /needs an output constraint/);
    // with a constraint it is served: no think section here, so all of the output is the answer
    const response = await client.generate({ ...ask, constraint: choice(["yes", "no"]),
      reasoning: reasoning({ constraintInReasoning: true }) });
    assert.ok(["yes", "no"].includes(response.text), response.text);
    assert.equal(response.reasoning, "");
  });

  test("closeEarly: a JSON output closed before max_tokens ran out is complete, and closed_early says why", async () => {
    const request = { chat: { messages: [{ role: "user", content: "Invent a person." }] }, max_tokens: 12, temperature: 0 };
    const response = await client.generate({ ...request, constraint: jsonSchema(PERSON_SCHEMA) });
    assert.equal(response.finish_reason, "FINISH_REASON_STOP");
    assert.equal(response.closed_early, "budget");
    assertPerson(JSON.parse(response.text));
    assert.ok(response.usage.forced_tokens > 0, JSON.stringify(response.usage));
    const tooShort = await rejection(client.generate({ ...request, max_tokens: 3, constraint: jsonSchema(PERSON_SCHEMA) }));
    assert.match(tooShort.details, /max_tokens is 3, but the shortest output this constraint accepts takes \d+ tokens/);
    const open = await client.generate({ ...request, constraint: jsonSchema(PERSON_SCHEMA, { closeEarly: false }) });
    assert.equal(open.closed_early, "");
    assert.equal(open.finish_reason, "FINISH_REASON_LENGTH");
  });

  test("structuralTag: the tagged call's content is in its schema", async () => {
    const weather = { type: "object", properties: { city: { type: "string", maxLength: 20 },
      unit: { enum: ["celsius", "fahrenheit"] } }, required: ["city", "unit"], additionalProperties: false };
    const call = { type: "tag", begin: "<function=get_weather>", content: { type: "json_schema", json_schema: weather },
      end: "</function>" };
    const constraint = structuralTag({ type: "structural_tag", format: { type: "triggered_tags", triggers: ["<function="],
      tags: [call], at_least_one: true, stop_after_first: true } });
    const response = await client.generate({ constraint, max_tokens: 60, temperature: 0,
      chat: { messages: [{ role: "user", content: "What is the weather in Paris? Call get_weather." }] } });
    const [, content] = response.text.match(/^<function=get_weather>(.*)<\/function>$/s) ?? assert.fail(response.text);
    const args = JSON.parse(content);
    assert.ok(typeof args.city === "string" && ["celsius", "fahrenheit"].includes(args.unit), content);
    const error = await rejection(client.generate({ prompt: "x", max_tokens: 4,
      constraint: structuralTag({ type: "structural_tag", format: { type: "nonsense" } }) }));
    assert.equal(error.code, "INVALID_ARGUMENT");
    assert.match(error.fieldViolations[0].field, /^constraint\.structural_tag/);
  });

  test("leaving a stream early cancels the request on the server", async () => {
    for await (const response of client.stream({ prompt: "Count: one, two,", max_tokens: 200, ignore_eos: true })) {
      assert.equal(typeof response.text, "string");
      break;
    }
    let load;
    for (let i = 0; i < 100; i++) {
      load = (await client.modelInfo()).load;
      if (load.num_in_flight === 0 && load.num_running === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal(load.num_in_flight, 0);
    assert.equal(load.num_running, 0);
  });

  test("validateConstraint: ok, or the compiler's error", async () => {
    const good = await client.validateConstraint(regex("[A-Z]{3}-[0-9]{4}"));
    assert.equal(good.ok, true);
    const bad = await client.validateConstraint(jsonSchema({ type: "array", uniqueItems: true }));
    assert.equal(bad.ok, false);
    assert.match(bad.error, /uniqueItems/);
    const bestEffort = await client.validateConstraint(jsonSchema({ type: "array", uniqueItems: true }, { strict: false }));
    assert.equal(bestEffort.ok, true);
    assert.ok(bestEffort.not_enforced.some((entry) => entry.includes("uniqueItems")));
  });

  test("grammarBackend: the request names its grammar library and the answer says which served it", async () => {
    const constraint = regex("[A-Z]{3}", { grammarBackend: "llguidance" });
    assert.equal(constraint.grammar_backend, "GRAMMAR_BACKEND_LLGUIDANCE");
    const report = await client.validateConstraint(constraint);
    assert.equal(report.ok, true);
    assert.equal(report.grammar_backend, "GRAMMAR_BACKEND_LLGUIDANCE");
    const response = await client.generate({ prompt: "Code:", max_tokens: 4, temperature: 0, constraint });
    assert.match(response.text, /^[A-Z]{3}$/);
    assert.equal(response.grammar_backend, "GRAMMAR_BACKEND_LLGUIDANCE");
    const plain = await client.generate({ prompt: "Code:", max_tokens: 4, temperature: 0, constraint: regex("[A-Z]{3}") });
    assert.equal(plain.grammar_backend, "GRAMMAR_BACKEND_XGRAMMAR"); // the server's default
    assert.throws(() => regex("a", { grammarBackend: "outlines" }), /grammarBackend must be one of auto, xgrammar, llguidance/);
  });

  test("min_tokens holds off a stop string until that many tokens", async () => {
    const request = { prompt: "Count: one, two, three,", max_tokens: 16, temperature: 0, stop: [","] };
    assert.ok((await client.generate(request)).usage.completion_tokens < 6);
    const response = await client.generate({ ...request, min_tokens: 6 });
    assert.ok(response.usage.completion_tokens >= 6, JSON.stringify(response.usage));
    const error = await rejection(client.generate({ ...request, min_tokens: 17 }));
    assert.match(error.details, /^min_tokens: must be in \[0, max_tokens \(16\)\]/);
  });

  test("INVALID_ARGUMENT names the field (max_tokens 0 is sent: optional presence survives)", async () => {
    const error = await rejection(client.generate({ prompt: "hi", max_tokens: 0 }));
    assert.ok(error instanceof FormworkError, String(error));
    assert.equal(error.code, "INVALID_ARGUMENT");
    assert.match(error.details, /^max_tokens: must be >= 1, got 0/);
    assert.deepEqual(error.fieldViolations.map((v) => v.field), ["max_tokens"]);
  });

  test("a schema that does not compile is INVALID_ARGUMENT on its field", async () => {
    const error = await rejection(client.extract({ type: "object", properties: { a: { type: "nonsense" } } }, "x"));
    assert.equal(error.code, "INVALID_ARGUMENT");
    assert.match(error.details, /Unsupported type "nonsense"/);
    assert.deepEqual(error.fieldViolations.map((v) => v.field), ["constraint.json_schema_text"]);
  });

  test("a deadline that passes is DEADLINE_EXCEEDED", async () => {
    const error = await rejection(client.generate({ prompt: "Once upon a time", max_tokens: 64, ignore_eos: true },
      { timeoutMs: 1 }));
    assert.equal(error.code, "DEADLINE_EXCEEDED");
  });

  test("extract with too few tokens is IncompleteOutputError", async () => {
    const error = await rejection(client.extract(PERSON_SCHEMA, "Ada Lovelace was 36 years old.", { maxTokens: 2, closeEarly: false }));
    assert.ok(error instanceof IncompleteOutputError, String(error));
    assert.equal(error.finishReason, "FINISH_REASON_LENGTH");
  });

  test("extractMany: people in input order, a document too long for the context its own error", async () => {
    const people = [["ada", "Ada Lovelace was 36 years old."], ["bob", "Bob is a 20 year old baker."],
      ["cleo", "Cleo, aged 41, runs the library."], ["dan", "Dan turned 67 last spring."], ["eve", "Eve is 29 and lives in Oslo."]];
    const documents = [...people.slice(0, 2), ["long", "word ".repeat(700)], ...people.slice(2)]; // the context is 512 tokens
    const progress = [];
    const results = await client.extractMany(documents, PERSON_SCHEMA,
      { concurrency: 4, maxTokens: 40, onProgress: (...counts) => progress.push(counts) });
    assert.deepEqual(results.map((r) => [r.index, r.id]), documents.map(([id], index) => [index, id]));
    for (const result of results.filter((r) => r.id !== "long")) {
      assert.ok(result.ok, String(result.error));
      assertPerson(result.value);
      assert.ok(result.usage.promptTokens > 0 && result.usage.completionTokens > 0, JSON.stringify(result.usage));
    }
    const failed = results[2];
    assert.ok(failed.error instanceof FormworkError, String(failed.error));
    assert.equal(failed.error.code, "INVALID_ARGUMENT");
    assert.match(failed.error.details, /context length is 512 tokens/);
    assert.equal(failed.value, null);
    assert.deepEqual(progress.map(([done]) => done), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(progress.at(-1), [6, 6, 1]);

    const asCompleted = [];
    for await (const result of client.extractMany(documents.map(([id, text]) => ({ id, text })), PERSON_SCHEMA,
      { concurrency: 3, ordered: false, maxTokens: 40 })) {
      asCompleted.push(result);
    }
    assert.deepEqual(asCompleted.map((r) => r.index).sort(), [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(asCompleted.filter((r) => !r.ok).map((r) => [r.id, r.error.code]), [["long", "INVALID_ARGUMENT"]]);
  });

  test("extractMany: UNAVAILABLE retried, then each document's error", async () => {
    const nowhere = new FormworkClient(`127.0.0.1:${await freePort()}`, { timeoutMs: 10_000 });
    try {
      const results = await nowhere.extractMany(["Ada is 36.", "Bob is 20."], PERSON_SCHEMA, { maxRetries: 2, backoffMs: 10 });
      assert.deepEqual(results.map((r) => [r.error.code, r.attempts]), [["UNAVAILABLE", 3], ["UNAVAILABLE", 3]]);
    } finally {
      nowhere.close();
    }
  });

  test("no server is UNAVAILABLE", async () => {
    const nowhere = new FormworkClient(`127.0.0.1:${await freePort()}`, { timeoutMs: 10_000 });
    try {
      const error = await rejection(nowhere.modelInfo());
      assert.equal(error.code, "UNAVAILABLE");
    } finally {
      nowhere.close();
    }
  });

  test("the example script prints an extracted person", () => {
    const script = fileURLToPath(new URL("../examples/extract.js", import.meta.url));
    const output = execFileSync(process.execPath, [script, "Bob is a 20 year old baker."], {
      env: { ...process.env, FORMWORK_ADDR: ADDRESS }, encoding: "utf8", timeout: 120_000,
    });
    assertPerson(JSON.parse(output));
  });
});
