// The Node client against a live server: FORMWORK_ADDR=host:port node --test clients/node/test/
// (tests/integration/test_node_client.py starts one and runs this; `make test` runs that). Light on tokens:
// the server may be a 2-core CPU machine.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createServer } from "node:net";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  choice, FormworkClient, FormworkError, IncompleteOutputError, jsonSchema, regex, tool, ToolCallAccumulator, toolCalls,
  toolChoice,
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
