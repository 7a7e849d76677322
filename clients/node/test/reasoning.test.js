// The Node client's reasoning() against a live server whose model has think markers:
// FORMWORK_THINK_ADDR=host:port node --test clients/node/test/reasoning.test.js (a server started with
// --think-markers "<think>,</think>"; tests/integration/test_node_client.py starts one and runs this).
// Without FORMWORK_THINK_ADDR the suite is skipped.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { FormworkClient, jsonSchema, reasoning, regex } from "formwork-client";

const ADDRESS = process.env.FORMWORK_THINK_ADDR;
const STEPS = String.raw`(Step [1-3]: [a-z ]{1,24}\n){1,3}`;
const PERSON_SCHEMA = {
  type: "object",
  properties: { name: { type: "string", maxLength: 12 }, age: { type: "integer", minimum: 0, maximum: 120 } },
  required: ["name", "age"],
  additionalProperties: false,
};
const INVENT = { chat: { messages: [{ role: "user", content: "Invent a person." }] }, temperature: 0 };

function assertPerson(text) {
  const person = JSON.parse(text);
  assert.deepEqual(Object.keys(person).sort(), ["age", "name"], text);
  assert.ok(typeof person.name === "string" && person.name.length <= 12, text);
  assert.ok(Number.isInteger(person.age) && person.age >= 0 && person.age <= 120, text);
}

async function rejection(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("expected the call to fail");
}

describe("reasoning() against a server with think markers", { skip: !ADDRESS && "FORMWORK_THINK_ADDR is not set" }, () => {
  let client;

  before(() => {
    client = new FormworkClient(ADDRESS, { timeoutMs: 120_000 });
  });

  after(() => client?.close());

  test("the server reads its markers: ModelInfo names them", async () => {
    const info = await client.modelInfo();
    assert.deepEqual([info.reasoning_start, info.reasoning_end], ["<think>", "</think>"]);
  });

  test("thinkConstraint: the reasoning matches its regex, the content the answer's schema", async () => {
    const response = await client.generate({ ...INVENT, max_tokens: 160, constraint: jsonSchema(PERSON_SCHEMA),
      reasoning: reasoning({ thinkConstraint: regex(STEPS) }) });
    assert.equal(response.finish_reason, "FINISH_REASON_STOP");
    assert.match(response.reasoning, new RegExp(`^${STEPS}$`));
    assertPerson(response.content);
    assert.ok(response.text.includes("</think>") && response.text.endsWith(response.content), response.text);
  });

  test("budgetTokens: a few tokens of thinking, then the end marker and the answer", async () => {
    const response = await client.generate({ ...INVENT, max_tokens: 64, constraint: jsonSchema(PERSON_SCHEMA),
      reasoning: reasoning({ budgetTokens: 5 }) });
    assert.ok(response.reasoning.length > 0, response.text);
    // the think text up to the forced end marker: 5 tokens, give or take one when it is tokenized again
    const { token_ids } = await client.tokenize({ prompt: response.reasoning });
    assert.ok(token_ids.length <= 6, `${token_ids.length} tokens: ${response.reasoning}`);
    assertPerson(response.content);
  });

  test("constraintInReasoning: one regex over the whole output, markers included; read back whole and streamed", async () => {
    const request = { chat: { messages: [{ role: "user", content: "Is the sky blue? Answer yes or no." }] },
      max_tokens: 40, temperature: 0, constraint: regex("<think>[a-z ]{1,30}</think>(yes|no)"),
      reasoning: reasoning({ constraintInReasoning: true }) };
    const response = await client.generate(request);
    assert.match(response.text, /^<think>[a-z ]{1,30}<\/think>(yes|no)$/);
    assert.equal(`<think>${response.reasoning}</think>${response.content}`, response.text);
    const messages = [];
    for await (const message of client.stream(request)) messages.push(message);
    const last = messages.at(-1);
    assert.equal(messages.map((m) => m.text).join(""), response.text);
    assert.deepEqual([last.reasoning, last.content], [response.reasoning, response.content]);
    assert.ok(messages.slice(0, -1).every((m) => m.reasoning === "" && m.content === ""), "final message only");
  });

  test("what cannot be served is INVALID_ARGUMENT naming the Reasoning field", async () => {
    const both = await rejection(client.generate({ ...INVENT, max_tokens: 16,
      reasoning: reasoning({ budgetTokens: 8, thinkConstraint: regex(STEPS) }) }));
    assert.deepEqual(both.fieldViolations.map((v) => v.field), ["reasoning.think_constraint"]);
    assert.match(both.details, /cannot be combined with reasoning.budget_tokens/);
    // Tokenize renders the think switch too: SmolLM2's template cannot turn thinking off
    const off = await rejection(client.tokenize({ chat: INVENT.chat, reasoning: reasoning({ enabled: false }) }));
    assert.equal(off.code, "INVALID_ARGUMENT");
    assert.deepEqual(off.fieldViolations.map((v) => v.field), ["reasoning.enabled"]);
  });
});
