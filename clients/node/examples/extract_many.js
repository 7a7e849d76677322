// Extract a person from each of several sentences, four calls at a time, against `make serve` (or
// $FORMWORK_ADDR); prints one JSON line per document in input order, then a summary on stderr:
//   node clients/node/examples/extract_many.js ["Ada Lovelace was 36." "Bob is a 20 year old baker." ...]
import { FormworkClient } from "formwork-client";

const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 30 },
    age: { type: "integer", minimum: 0, maximum: 150 },
  },
  required: ["name", "age"],
  additionalProperties: false,
};
const texts = process.argv.length > 2 ? process.argv.slice(2)
  : ["Ada Lovelace was 36 years old.", "Bob is a 20 year old baker.", "Cleo, aged 41, runs the library."];

const client = new FormworkClient(process.env.FORMWORK_ADDR ?? "127.0.0.1:50051", { timeoutMs: 60_000 });
try {
  const results = await client.extractMany(texts.map((text, i) => [`doc-${i + 1}`, text]), schema, {
    concurrency: 4,
    maxTokens: 48,
    onProgress: (done, total, failed) => console.error(`${done}/${total} done, ${failed} failed`),
  });
  for (const { id, value, error, usage } of results) {
    // a failed document carries its error (code and the server's details); the others are unaffected
    console.log(JSON.stringify(error ? { id, error: error.message } : { id, value, tokens: usage.completionTokens }));
  }
  if (results.some((result) => !result.ok)) process.exitCode = 1;
} finally {
  client.close();
}
