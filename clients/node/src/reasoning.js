// Reasoning for GenerateRequest (and TokenizeRequest): the think section of a model with think markers,
// as the proto's Reasoning message.
//
//   const request = { chat: { messages }, constraint: jsonSchema(schema),
//                     reasoning: reasoning({ thinkConstraint: regex("(Step [1-3]: [a-z ]+\n){1,3}") }) };
//   const response = await client.generate(request); // response.reasoning, then response.content

import { KINDS } from "./constraints.js";

const OPTIONS = ["enabled", "budgetTokens", "thinkConstraint", "constraintInReasoning"];

/**
 * A Reasoning message. `enabled`: think before answering (default: the model's; off needs a chat
 * template that can switch thinking off). `budgetTokens`: the most tokens of thinking, then the end
 * marker is forced. `thinkConstraint`: a constraint (jsonSchema(), regex(), ...) the think text must
 * match. `constraintInReasoning`: the request's constraint covers the whole output from its first
 * token, think section included. Options left undefined are not sent; the server says which ones
 * cannot be combined. Throws TypeError for an option it does not know (a misspelt key would
 * otherwise be dropped silently on the wire) or a thinkConstraint that is not a built constraint.
 */
export function reasoning(options = {}) {
  const unknown = Object.keys(options).filter((name) => !OPTIONS.includes(name));
  if (unknown.length) {
    throw new TypeError(`reasoning() got unknown options: ${unknown.join(", ")} (it takes ${OPTIONS.join(", ")})`);
  }
  const { enabled, budgetTokens, thinkConstraint, constraintInReasoning } = options;
  const message = {};
  if (enabled !== undefined) message.enabled = checked("enabled", enabled, "boolean");
  if (budgetTokens !== undefined) {
    if (!Number.isInteger(budgetTokens) || budgetTokens < 0) {
      throw new TypeError(`budgetTokens must be an integer >= 0, got ${budgetTokens}`);
    }
    message.budget_tokens = budgetTokens;
  }
  if (thinkConstraint !== undefined) {
    if (thinkConstraint === null || typeof thinkConstraint !== "object" || !KINDS.some((kind) => kind in thinkConstraint)) {
      throw new TypeError("thinkConstraint must be a constraint built by jsonSchema(), jsonObject(), regex(), grammar() " +
        "or choice()");
    }
    message.think_constraint = thinkConstraint;
  }
  if (constraintInReasoning !== undefined) {
    message.constraint_in_reasoning = checked("constraintInReasoning", constraintInReasoning, "boolean");
  }
  return message;
}

function checked(name, value, type) {
  if (typeof value !== type) throw new TypeError(`${name} must be a ${type}, got ${typeof value}`);
  return value;
}
