// What the client throws: FormworkError for a call that ended with a gRPC status (the server's
// message and, for INVALID_ARGUMENT, the fields it names), IncompleteOutputError when extract()'s
// output ended before its JSON was complete.
import grpc from "@grpc/grpc-js";
import protobuf from "protobufjs";

const STATUS_DETAILS_KEY = "grpc-status-details-bin";
const BAD_REQUEST_TYPE_URL = "type.googleapis.com/google.rpc.BadRequest";
const RETRY_INFO_TYPE_URL = "type.googleapis.com/google.rpc.RetryInfo";

// google.rpc.Status and BadRequest, the rich error details the server sends in its trailers
const rpc = protobuf.parse(`
  syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message BadRequest {
    message FieldViolation { string field = 1; string description = 2; }
    repeated FieldViolation field_violations = 1;
  }
  message Duration { int64 seconds = 1; int32 nanos = 2; }
  message RetryInfo { Duration retry_delay = 1; }
`, { keepCase: true }).root;
const Status = rpc.lookupType("google.rpc.Status");
const BadRequest = rpc.lookupType("google.rpc.BadRequest");
const RetryInfo = rpc.lookupType("google.rpc.RetryInfo");

const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, number]) => [number, name]));

export class FormworkError extends Error {
  /**
   * @param {number} grpcCode  the gRPC status code (grpc.status.*)
   * @param {string} details  the server's message, as sent
   * @param {{field: string, description: string}[]} fieldViolations
   * @param {number|null} retryAfterMs  set when the server says the same call may succeed after this long
   */
  constructor(grpcCode, details, fieldViolations = [], retryAfterMs = null) {
    const code = CODE_NAMES[grpcCode] ?? "UNKNOWN";
    super(`${code}: ${details}`);
    this.name = "FormworkError";
    this.code = code; // "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED", ...
    this.grpcCode = grpcCode;
    this.details = details;
    this.fieldViolations = fieldViolations;
    this.retryAfterMs = retryAfterMs;
  }
}

export class IncompleteOutputError extends Error {
  constructor(response) {
    super(`the output ended with ${response.finish_reason} after ${response.usage?.completion_tokens ?? "?"} ` +
      "tokens, before the JSON was complete; raise maxTokens or bound the schema's strings and arrays " +
      "(maxLength, maxItems)");
    this.name = "IncompleteOutputError";
    this.response = response;
    this.finishReason = response.finish_reason;
    this.text = response.text; // the incomplete JSON text
  }
}

/**
 * Whether the same call sent again later may succeed: UNAVAILABLE (the server is loading,
 * restarting, unreachable, or went away mid-call), and RESOURCE_EXHAUSTED when the server says it
 * is overloaded (it sends a retry delay, `retryAfterMs`). A request too large for the engine's KV
 * cache is RESOURCE_EXHAUSTED without one: it never succeeds. The Python client's
 * errors.is_transient is the same rule.
 */
export function isTransient(error) {
  if (!(error instanceof FormworkError)) return false;
  if (error.code === "UNAVAILABLE") return true;
  return error.code === "RESOURCE_EXHAUSTED" && error.retryAfterMs !== null;
}

// in what grpc-js reports for an HTTP/2 RST_STREAM that ended a call before any status arrived, e.g.
// "Received RST_STREAM with code 2 (Internal server error)" from Envoy
const RESET_DETAILS = "Received RST_STREAM";

/**
 * The FormworkError for a grpc-js ServiceError (or the error itself if it carries no status).
 * A reset that ended the call without a status is UNAVAILABLE: a Formwork server ends every call
 * with a status, so the server (or the connection to it) went away mid-call; a proxy such as Envoy
 * can only reset a stream whose replica died after the first output, and grpc-js calls that
 * INTERNAL. The call may be sent again, as for a server that cannot be reached.
 */
export function fromServiceError(error) {
  if (typeof error?.code !== "number") {
    return error;
  }
  const details = error.details ?? error.message;
  if (error.code === grpc.status.INTERNAL && details?.includes(RESET_DETAILS)) {
    return new FormworkError(grpc.status.UNAVAILABLE, "the call was cut off before it finished (the server or " +
      `the connection to it went away): ${details}`);
  }
  const { violations, retryAfterMs } = statusDetails(error.metadata);
  return new FormworkError(error.code, details, violations, retryAfterMs);
}

// the field violations and the retry delay in the google.rpc.Status of the trailers
function statusDetails(metadata) {
  const [encoded] = metadata?.get(STATUS_DETAILS_KEY) ?? [];
  const details = encoded ? Status.decode(encoded).details : [];
  const violations = details
    .filter((detail) => detail.type_url === BAD_REQUEST_TYPE_URL)
    .flatMap((detail) => BadRequest.decode(detail.value).field_violations)
    .map(({ field, description }) => ({ field, description }));
  const retry = details.find((detail) => detail.type_url === RETRY_INFO_TYPE_URL);
  const delay = retry && RetryInfo.decode(retry.value).retry_delay;
  const retryAfterMs = retry ? Number(delay?.seconds ?? 0) * 1000 + (delay?.nanos ?? 0) / 1e6 : null;
  return { violations, retryAfterMs };
}
