#!/usr/bin/env python3
"""Validates the walks grammar/tests/schema_corpus.rs wrote (a JSONL file) with the `jsonschema`
package: every walk that ended must be a document of its schema. Prints the counts (compiled,
ended, valid, invalid; formats checked separately) and each invalid one.

    python3 scripts/check-schema-corpus.py walks.jsonl
"""

import json
import sys

import jsonschema
from jsonschema import FormatChecker
from jsonschema.validators import validator_for


def main(path):
    total = compiled = ended = valid = invalid = format_only = 0
    for line in open(path):
        r = json.loads(line)
        total += 1
        if not r["compiled"]:
            continue
        compiled += 1
        if not r.get("ended"):
            continue
        ended += 1
        schema = json.load(open(r["schema"]))
        try:
            doc = json.loads(r["output"])
        except ValueError as e:
            invalid += 1
            print(f"not JSON: {r['schema']}: {e}: {r['output'][:200]!r}")
            continue
        cls = validator_for(schema)
        errors = list(cls(schema).iter_errors(doc))
        if errors:
            invalid += 1
            print(f"invalid: {r['schema']}: {errors[0].message[:200]}")
            continue
        if list(cls(schema, format_checker=FormatChecker()).iter_errors(doc)):
            format_only += 1
        valid += 1
    print(
        f"{total} schemas, {compiled} compiled ({100 * compiled / max(total, 1):.1f} %), "
        f"{ended} walks ended, {valid} valid, {invalid} invalid "
        f"({format_only} of the valid fail a 'format' check)"
    )
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
