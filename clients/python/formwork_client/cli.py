"""`formwork-client`: the Python client from a shell.

    formwork-client extract --schema schema.json --text "Ada Lovelace, born 1815 in London."
    formwork-client generate --prompt "Name a color." [--stream] [--json] [--json-schema FILE | --regex R | ...]
    formwork-client validate --json-schema schema.json
    formwork-client model-info

The server is --address, else $FORMWORK_ADDR, else 127.0.0.1:50051 (what `make serve` uses).
Exit status: 0 done; 1 the server refused or failed the call (the status and its message on
stderr), or `validate` found the constraint bad; 2 a usage error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from google.protobuf import json_format

from formwork_client import constraints
from formwork_client._gen.formwork.v1 import generation_pb2 as pb
from formwork_client.client import Client
from formwork_client.errors import FormworkError, StatusError
from formwork_client.request import DEFAULT_ADDRESS


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="formwork-client", description="Call a Formwork server over gRPC.")
    parser.add_argument("--address", default=os.environ.get("FORMWORK_ADDR", DEFAULT_ADDRESS),
                        help="host:port of the server (default: $FORMWORK_ADDR or %(default)s)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per call (default: none)")
    parser.add_argument("--api-key", default=None, help="sent as 'authorization: Bearer KEY' (default: $FORMWORK_API_KEY)")
    parser.add_argument("--tls", action="store_true", help="TLS, trusting the system's CAs")
    parser.add_argument("--tls-ca", metavar="PEM", help="TLS, trusting this CA (e.g. the server's self-signed cert)")
    parser.add_argument("--tls-client-cert", metavar="PEM", help="mutual TLS: this client's certificate chain")
    parser.add_argument("--tls-client-key", metavar="PEM", help="mutual TLS: its private key")
    sub = parser.add_subparsers(dest="command", required=True)

    extract = sub.add_parser("extract", help="the JSON a schema describes, extracted from a text")
    extract.add_argument("--schema", required=True, metavar="FILE|-", help="JSON Schema file, or - for stdin")
    extract.add_argument("--text", required=True, help="the text to extract from, or - for stdin")
    extract.add_argument("--instructions", default=None, help="replaces the default system instructions")
    extract.add_argument("--max-tokens", type=int, default=None, help="default: the server's default_max_tokens")
    extract.add_argument("--best-effort", action="store_true", help="accept schema keywords that cannot be enforced")
    extract.set_defaults(func=cmd_extract)

    generate = sub.add_parser("generate", help="generate text, optionally constrained")
    generate.add_argument("--prompt", required=True, help="the user's message, or - for stdin")
    generate.add_argument("--system", default=None, help="system message (chat mode)")
    generate.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    generate.add_argument("--max-tokens", type=int, default=None, help="default: the server's default_max_tokens")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the CLI's default)")
    generate.add_argument("--seed", type=int, default=None)
    generate.add_argument("--stream", action="store_true", help="print the text as it is generated")
    generate.add_argument("--json", action="store_true",
                          help="print the response message as JSON (with --stream: one line per message)")
    _add_constraint_args(generate)
    generate.set_defaults(func=cmd_generate)

    validate = sub.add_parser("validate", help="compile a constraint without generating")
    _add_constraint_args(validate)
    validate.set_defaults(func=cmd_validate)

    info = sub.add_parser("model-info", help="the model, the server's limits and its load")
    info.set_defaults(func=cmd_model_info)
    return parser


def _add_constraint_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("constraint (at most one)")
    group.add_argument("--json-schema", metavar="FILE|-", help="JSON Schema file, or - for stdin")
    group.add_argument("--json-object", action="store_true", help="any JSON object")
    group.add_argument("--regex", metavar="R")
    group.add_argument("--grammar", metavar="FILE", help="EBNF grammar file (xgrammar syntax, start rule root)")
    group.add_argument("--choice", action="append", metavar="TEXT", help="repeat for each allowed output")
    group.add_argument("--best-effort", action="store_true", help="accept schema keywords that cannot be enforced")
    group.add_argument("--any-whitespace", action="store_true", help="allow free whitespace in JSON")
    group.add_argument("--whitespace", choices=("compact", "spaced", "bounded", "any"), default=None,
                       help="whitespace between JSON tokens (default: the server's)")


def _constraint(args: argparse.Namespace) -> pb.Constraint | None:
    given = [name for name in ("json_schema", "json_object", "regex", "grammar", "choice") if getattr(args, name)]
    if len(given) > 1:
        raise UsageError(f"give at most one constraint, got {', '.join('--' + g.replace('_', '-') for g in given)}")
    strict = False if args.best_effort else None
    any_whitespace = True if args.any_whitespace else None
    if not given:
        return None
    kind = given[0]
    if kind == "json_schema":
        return constraints.json_schema(_read(args.json_schema), strict=strict, any_whitespace=any_whitespace,
                                       whitespace=args.whitespace)
    if kind == "json_object":
        return constraints.json_object(any_whitespace=any_whitespace, whitespace=args.whitespace)
    if kind == "regex":
        return constraints.regex(args.regex, strict=strict)
    if kind == "grammar":
        return constraints.grammar(_read(args.grammar), strict=strict)
    return constraints.choice(args.choice)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def _to_json(message: Any) -> str:
    """One line of JSON with the proto's field names; fields at their default are printed too."""
    as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                        always_print_fields_with_no_presence=True)
    return json.dumps(as_dict, ensure_ascii=False)


def cmd_extract(client: Client, args: argparse.Namespace) -> int:
    schema = _read(args.schema)
    try:
        json.loads(schema)
    except json.JSONDecodeError as e:
        raise UsageError(f"{args.schema} is not JSON: {e}") from None
    text = sys.stdin.read() if args.text == "-" else args.text
    result = client.extract(schema, text, args.instructions, max_tokens=args.max_tokens,
                            strict=False if args.best_effort else None)
    print(json.dumps(result, ensure_ascii=False))
    return 0


def cmd_generate(client: Client, args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.raw:
        if args.system:
            raise UsageError("--system needs the chat template; leave out --raw")
        input_fields: dict[str, Any] = {"prompt": prompt}
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": prompt}]
        input_fields = {"messages": messages}
    fields = dict(input_fields, constraint=_constraint(args), max_tokens=args.max_tokens,
                  temperature=args.temperature, seed=args.seed)
    if not args.stream:
        response = client.generate(**fields)
        print(_to_json(response) if args.json else response.text)
        return 0
    for response in client.stream(**fields):
        if args.json:
            print(_to_json(response), flush=True)
        else:
            print(response.text, end="", flush=True)
    if not args.json:
        print()
    return 0


def cmd_validate(client: Client, args: argparse.Namespace) -> int:
    constraint = _constraint(args)
    if constraint is None:
        raise UsageError("give a constraint: --json-schema, --json-object, --regex, --grammar or --choice")
    response = client.validate_constraint(constraint)
    print(_to_json(response))
    return 0 if response.ok else 1


def cmd_model_info(client: Client, args: argparse.Namespace) -> int:
    print(_to_json(client.model_info()))
    return 0


def _connection_args(args: argparse.Namespace) -> dict[str, Any]:
    pems = {name: _read_pem(path) for name, path in (("root_certificates", args.tls_ca),
                                                      ("certificate_chain", args.tls_client_cert),
                                                      ("private_key", args.tls_client_key)) if path}
    if ("certificate_chain" in pems) != ("private_key" in pems):
        raise UsageError("mutual TLS needs both --tls-client-cert and --tls-client-key")
    return {"api_key": args.api_key, "tls": True if args.tls else None, **pems}


def _read_pem(path: str) -> bytes:
    try:
        return open(path, "rb").read()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with Client(args.address, timeout=args.timeout, **_connection_args(args)) as client:
            return args.func(client, args)
    except UsageError as e:
        parser.error(str(e))  # exits 2
    except StatusError as e:
        print(f"formwork-client: {e}", file=sys.stderr)
        for violation in e.field_violations:
            print(f"  {violation.field}: {violation.description}", file=sys.stderr)
        return 1
    except FormworkError as e:
        print(f"formwork-client: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
