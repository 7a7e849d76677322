// Tools for GenerateRequest: builders for the proto's Tool and ToolChoice messages, and reading a
// response's calls back.
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
 * shown to the model).
 */
export function toolChoice(choice) {
  if (choice !== null && typeof choice === "object" && Array.isArray(choice.allowed)) {
    const mode = choice.mode ?? "auto";
    if (mode !== "auto" && mode !== "required") throw new TypeError(`allowed tools' mode is "auto" or "required"`);
    return { allowed_tools: { mode: MODES[mode], function_names: choice.allowed } };
  }
  if (typeof choice !== "string") {
    throw new TypeError(`a tool choice is "none", "auto", "required", a tool's name or { allowed, mode }`);
  }
  return choice in MODES ? { mode: MODES[choice] } : { function_name: choice };
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
