// The request builders (constraints, reasoning, tools) without a server: each built object is sent
// through the proto's own serializer and read back, so a field the proto does not have (which
// protobufjs drops without a word) fails here, not silently on a live call.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  chatMessage, choice, grammar, jsonObject, jsonSchema, loadGenerationService, reasoning, regex, structuralTag, tool,
  toolChoice,
} from "formwork-client";

const { Generate, Tokenize } = loadGenerationService().service;

/** The request as the server receives it: serialized with the proto, read back with defaults. */
function onTheWire(request, method = Generate) {
  return method.requestDeserialize(method.requestSerialize(request));
}

const PERSON = { type: "object", properties: { name: { type: "string" } }, required: ["name"] };

describe("reasoning()", () => {
  test("every Reasoning field reaches the wire under its proto name", () => {
    const think = regex("(Step [1-3]: [a-z ]+\n){1,3}", { jumpForward: false });
    const sent = onTheWire({ prompt: "x", reasoning: reasoning({ enabled: true, budgetTokens: 64, thinkConstraint: think }) });
    assert.equal(sent.reasoning.enabled, true);
    assert.equal(sent.reasoning.budget_tokens, 64);
    assert.equal(sent.reasoning.think_constraint.regex, think.regex);
    assert.equal(sent.reasoning.think_constraint.jump_forward, false);
    assert.equal(sent.reasoning.constraint_in_reasoning, false);
    const whole = onTheWire({ prompt: "x", constraint: jsonSchema(PERSON), reasoning: reasoning({ constraintInReasoning: true }) });
    assert.equal(whole.reasoning.constraint_in_reasoning, true);
    assert.equal(whole.reasoning.think_constraint, null);
  });

  test("unset options are not sent (the model's default applies), false is", () => {
    assert.deepEqual(reasoning(), {});
    const sent = onTheWire({ prompt: "x", reasoning: reasoning({ enabled: false, budgetTokens: 0 }) });
    assert.equal(sent.reasoning._enabled, "enabled"); // proto3 optional: present, and false
    assert.equal(sent.reasoning.enabled, false);
    assert.equal(sent.reasoning._budget_tokens, "budget_tokens");
    assert.equal(onTheWire({ prompt: "x", reasoning: reasoning() }).reasoning._enabled, undefined);
  });

  test("a Tokenize request takes it too, so a chat renders as Generate renders it", () => {
    const sent = onTheWire({ chat: { messages: [{ role: "user", content: "hi" }] }, reasoning: reasoning({ enabled: false }) },
      Tokenize);
    assert.equal(sent.reasoning.enabled, false);
  });

  test("bad options are a TypeError naming them, not a field dropped on the wire", () => {
    assert.throws(() => reasoning({ budget_tokens: 8 }), /unknown options: budget_tokens/);
    assert.throws(() => reasoning({ budgetTokens: -1 }), /budgetTokens must be an integer >= 0/);
    assert.throws(() => reasoning({ enabled: "yes" }), /enabled must be a boolean/);
    assert.throws(() => reasoning({ thinkConstraint: PERSON }), /thinkConstraint must be a constraint built by/);
    assert.throws(() => reasoning({ constraintInReasoning: 1 }), /constraintInReasoning must be a boolean/);
  });
});

describe("constraints", () => {
  test("every builder's options reach the wire", () => {
    const cases = [
      [jsonSchema(PERSON, { strict: false, whitespace: "spaced", closeEarly: false, grammarBackend: "llguidance" }),
        { json_schema_text: JSON.stringify(PERSON), strict: false, whitespace: "JSON_WHITESPACE_SPACED", close_early: false,
          grammar_backend: "GRAMMAR_BACKEND_LLGUIDANCE" }],
      [jsonObject({ anyWhitespace: true, closeEarly: false, grammarBackend: "auto" }),
        { any_whitespace: true, close_early: false, grammar_backend: "GRAMMAR_BACKEND_AUTO" }],
      [regex("[0-9]+", { jumpForward: false, grammarBackend: "xgrammar" }),
        { regex: "[0-9]+", jump_forward: false, grammar_backend: "GRAMMAR_BACKEND_XGRAMMAR" }],
      [grammar('root ::= "a"', { strict: true }), { grammar: 'root ::= "a"', strict: true }],
      [choice(["yes", "no"], { grammarBackend: "llguidance" }), { grammar_backend: "GRAMMAR_BACKEND_LLGUIDANCE" }],
      [structuralTag({ type: "structural_tag", format: { type: "const_string", value: "hi" } }, { whitespace: "compact" }),
        { structural_tag: '{"type":"structural_tag","format":{"type":"const_string","value":"hi"}}',
          whitespace: "JSON_WHITESPACE_COMPACT" }],
    ];
    for (const [constraint, expected] of cases) {
      const sent = onTheWire({ prompt: "x", constraint }).constraint;
      for (const [field, value] of Object.entries(expected)) assert.equal(sent[field], value, `${field} of ${JSON.stringify(constraint)}`);
    }
    assert.deepEqual(onTheWire({ prompt: "x", constraint: choice(["yes", "no"]) }).constraint.choice.choices, ["yes", "no"]);
  });

  test("min_tokens and the tool fields are request fields of their own", () => {
    const sent = onTheWire({ prompt: "x", max_tokens: 8, min_tokens: 4, parallel_tool_calls: false,
      tools: [tool("f", PERSON)], tool_choice: toolChoice("f") });
    assert.equal(sent.min_tokens, 4);
    assert.equal(sent.parallel_tool_calls, false);
    assert.equal(sent.tools[0].parameters_json, JSON.stringify(PERSON));
    assert.equal(sent.tool_choice.function_name, "f");
  });
});

describe("toolChoice()", () => {
  const allowed = { mode: "TOOL_CHOICE_MODE_REQUIRED", function_names: ["get_weather", "get_time"] };

  test("modes, a tool's name, and allowed tools in Formwork's and OpenAI's shapes", () => {
    assert.deepEqual(toolChoice("none"), { mode: "TOOL_CHOICE_MODE_NONE" });
    assert.deepEqual(toolChoice("get_weather"), { function_name: "get_weather" });
    assert.deepEqual(toolChoice({ type: "function", function: { name: "get_weather" } }), { function_name: "get_weather" });
    assert.deepEqual(toolChoice({ allowed: ["get_weather", "get_time"], mode: "required" }), { allowed_tools: allowed });
    const openai = { mode: "required", tools: [{ type: "function", function: { name: "get_weather" } },
      { type: "function", function: { name: "get_time" } }] };
    assert.deepEqual(toolChoice({ type: "allowed_tools", allowed_tools: openai }), { allowed_tools: allowed });
    assert.deepEqual(toolChoice({ type: "allowed_tools", ...openai }), { allowed_tools: allowed }); // the Responses API's
    assert.deepEqual(toolChoice({ allowed: ["get_time"] }).allowed_tools.mode, "TOOL_CHOICE_MODE_AUTO");
    assert.deepEqual(onTheWire({ prompt: "x", tool_choice: toolChoice({ allowed: ["get_weather", "get_time"], mode: "required" }) })
      .tool_choice.allowed_tools, allowed);
  });

  test("a malformed choice is a TypeError", () => {
    assert.throws(() => toolChoice({ allowed: ["a"], mode: "none" }), /mode is "auto" or "required"/);
    assert.throws(() => toolChoice({ allowed: [] }), /at least one tool/);
    assert.throws(() => toolChoice({ type: "allowed_tools", allowed_tools: { mode: "auto" } }), /needs tools/);
    assert.throws(() => toolChoice({ type: "function", function: {} }), /named tool choice/);
    assert.throws(() => toolChoice(3), /a tool choice is/);
  });
});

describe("chatMessage()", () => {
  test("an OpenAI-shaped conversation with a call and its result goes on the wire as ChatMessages", () => {
    const messages = [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [
        { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } },
        { id: "call_2", type: "function", function: { name: "get_time", arguments: { city: "Paris" } } }] },
      { role: "tool", tool_call_id: "call_1", name: "get_weather", content: "18 C" },
    ].map(chatMessage);
    const sent = onTheWire({ chat: { messages } }).chat.messages;
    assert.deepEqual(sent[1].tool_calls, [{ id: "call_1", name: "get_weather", arguments_json: '{"city":"Paris"}' },
      { id: "call_2", name: "get_time", arguments_json: '{"city":"Paris"}' }]);
    assert.equal(sent[1].content, "");
    assert.deepEqual([sent[2].role, sent[2].tool_call_id, sent[2].name, sent[2].content], ["tool", "call_1", "get_weather", "18 C"]);
  });

  test("calls as toolCalls() and a response give them come back unchanged", () => {
    const parsed = chatMessage({ role: "assistant", content: "", tool_calls: [{ id: "c", name: "f", arguments: { a: 1 } }] });
    const raw = chatMessage({ role: "assistant", content: "", tool_calls: [{ id: "c", name: "f", arguments_json: '{"a":1}' }] });
    assert.deepEqual(parsed, raw);
    assert.throws(() => chatMessage({ content: "hi" }), /needs a string role/);
    assert.throws(() => chatMessage({ role: "assistant", tool_calls: [{ id: "c", function: {} }] }), /needs a name/);
  });
});
