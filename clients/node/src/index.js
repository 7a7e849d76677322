// Node.js client for Formwork's gRPC API (formwork.v1.Generation): structured-output generation.
//
//   import { FormworkClient } from "formwork-client";
//   const client = new FormworkClient("127.0.0.1:50051");
//   const person = await client.extract(schema, "Ada Lovelace was born in 1815.");
export { DEFAULT_ADDRESS, FormworkClient, loadGenerationService, PROTO_ROOT } from "./client.js";
export {
  CONSTRAINT_KEY_HEADER, choice, constraintKey, grammar, jsonObject, jsonSchema, regex, structuralTag,
} from "./constraints.js";
export { FormworkError, IncompleteOutputError, isTransient } from "./errors.js";
export { extractPrompt, extractRequest, retryDelayMs } from "./extraction.js";
export { reasoning } from "./reasoning.js";
export { chatMessage, tool, ToolCallAccumulator, toolCalls, toolChoice } from "./tools.js";
