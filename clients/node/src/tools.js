// Tools for GenerateRequest: builders for the proto's Tool and ToolChoice messages, chat messages with
// calls in them (OpenAI's shape in), and reading a response's calls back.
//
//   const request = { chat: { messages }, tools: [tool("get_weather", schema, "Current weather")],
//                     tool_choice: toolChoice("required"), parallel_tool_calls: false };
//   const [call] = toolCalls(await client.generate(request)); // { id, name, arguments: {...} }

const MODES = { none: "TOOL_CHOICE_MODE_NONE", auto: "TOOL_CHOICE_MODE_AUTO", required: "TOOL_CHOICE_MODE_REQUIRED" };

/**
 * A Tool: `parameters` is a JSON Schema (an object, or its JSON text; property order is kept);
 * omitted, the arguments are any JSON object. An OpenAI-shaped tool
 * ({ type: "function", function: { name, description, parameters } }) may be passed as `name`.
 */
export function tool(name, parameters, description = "") {
  if (name !== null && typeof name === "object") {
    const fn = name.function ?? name;
    return tool(fn.name, fn.parameters, fn.description ?? "");
  }
  if (typeof name !== "string") throw new TypeError("a tool needs a string name");
  const parametersJson = parameters === undefined ? "" : typeof parameters === "string" ? parameters : JSON.stringify(parameters);
  return { name, description, parameters_json: parametersJson };
}

/**
 * A ToolChoice: "none", "auto", "required", a tool's name (only calls of that tool), or
 * { allowed: [names], mode: "auto" | "required" } (calls only of those tools; every tool is still
 * shown to the model). OpenAI's shapes are taken too: { type: "function", function: { name } }, and
 * { type: "allowed_tools", allowed_tools: { mode, tools: [{ type: "function", function: { name } }] } }
 * (or with mode and tools beside type, as the Responses API writes it).
 */
export function toolChoice(choice) {
  if (choice !== null && typeof choice === "object" && Array.isArray(choice.allowed)) {
    return allowedTools(choice.mode, choice.allowed);
  }
  if (choice?.type === "allowed_tools") {
    const { mode, tools } = choice.allowed_tools ?? choice;
    if (!Array.isArray(tools)) throw new TypeError("allowed_tools needs tools: [{ type: \"function\", function: { name } }]");
    return allowedTools(mode, tools.map((t) => (t?.function ?? t)?.name));
  }
  if (choice !== null && typeof choice === "object") {
    const name = choice.function?.name;
    if (typeof name !== "string") {
      throw new TypeError(`a named tool choice is { type: "function", function: { name } }, got ${JSON.stringify(choice)}`);
    }
    return { function_name: name };
  }
  if (typeof choice !== "string") {
    throw new TypeError(`a tool choice is "none", "auto", "required", a tool's name or { allowed, mode }`);
  }
  return choice in MODES ? { mode: MODES[choice] } : { function_name: choice };
}

function allowedTools(mode = "auto", names) {
  if (mode !== "auto" && mode !== "required") throw new TypeError(`allowed tools' mode is "auto" or "required"`);
  if (names.length === 0 || !names.every((name) => typeof name === "string")) {
    throw new TypeError("allowed tools need at least one tool, each named by a string");
  }
  return { allowed_tools: { mode: MODES[mode], function_names: names } };
}

/**
 * A ChatMessage from OpenAI's shape, so a conversation kept in that shape goes back as the model
 * expects: an assistant's `tool_calls` ({ id, type: "function", function: { name, arguments } },
 * arguments as JSON text or an object; also toolCalls()'s { id, name, arguments } and the response's
 * own { id, name, arguments_json }), a tool result's `tool_call_id` and `name`. A null content is "".
 */
export function chatMessage(message) {
  if (typeof message?.role !== "string") throw new TypeError("a chat message needs a string role");
  const out = { role: message.role, content: message.content ?? "" };
  if (message.tool_call_id) out.tool_call_id = message.tool_call_id;
  if (message.name) out.name = message.name;
  if (message.tool_calls?.length) out.tool_calls = message.tool_calls.map(toolCallMessage);
  return out;
}

function toolCallMessage(call) {
  const fn = call.function ?? call;
  if (typeof fn.name !== "string") throw new TypeError(`a tool call needs a name, got ${JSON.stringify(call)}`);
  const args = call.arguments_json ?? fn.arguments ?? "";
  return { id: call.id ?? "", name: fn.name, arguments_json: typeof args === "string" ? args : JSON.stringify(args) };
}

/** A finished response's calls, with their arguments parsed: [{ id, name, arguments }]. */
export function toolCalls(response) {
  return (response.tool_calls ?? []).map((call) => ({
    id: call.id, name: call.name, arguments: JSON.parse(call.arguments_json || "{}"),
  }));
}

/**
 * Adds up a stream's tool_call_deltas (one response at a time) into calls as the final response
 * has them: [{ id, name, arguments_json }].
 */
export class ToolCallAccumulator {
  calls = [];

  add(response) {
    for (const delta of response.tool_call_deltas ?? []) {
      if (delta.id) this.calls[delta.index] = { id: delta.id, name: delta.name, arguments_json: "" };
      this.calls[delta.index].arguments_json += delta.arguments_delta;
    }
    return this;
  }
}
