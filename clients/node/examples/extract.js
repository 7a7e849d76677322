// Extract a person from a sentence with a JSON Schema, against `make serve` (or $FORMWORK_ADDR):
//   node clients/node/examples/extract.js ["Grace Hopper was 85 when she died in Arlington."]
import { FormworkClient, FormworkError } from "formwork-client";

const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 30 },
    age: { type: "integer", minimum: 0, maximum: 150 },
  },
  required: ["name", "age"],
  additionalProperties: false,
};
const text = process.argv[2] ?? "Grace Hopper was 85 when she died in Arlington.";

const client = new FormworkClient(process.env.FORMWORK_ADDR ?? "127.0.0.1:50051", { timeoutMs: 60_000 });
try {
  const person = await client.extract(schema, text, { maxTokens: 48 });
  console.log(JSON.stringify(person));
} catch (error) {
  // e.g. UNAVAILABLE when no server is running, INVALID_ARGUMENT for a schema it cannot enforce
  console.error(error instanceof FormworkError ? `${error.code}: ${error.details}` : error);
  process.exitCode = 1;
} finally {
  client.close();
}
