"""docs/openapi.yaml against what codexec really answers.

The harness hands every answer of codexec's (those with its X-Request-Id)
to check(); a method the document gives the path must document the
status, and a JSON body must match the documented schema. run.py reports
what did not, after the system tests."""

import json
import os
import re

import jsonschema
import yaml

SPEC_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "openapi.yaml")


class Spec:
    def __init__(self, path=SPEC_PATH):
        with open(path) as f:
            self.doc = yaml.safe_load(f)
        self.resolver = jsonschema.RefResolver.from_schema(self.doc)
        self.paths = []
        for template, item in self.doc["paths"].items():
            # a trailing {path} is a workspace path: slashes and all
            esc = re.escape(template)
            esc = re.sub(r"\\\{path\\\}$", ".+", esc)
            rx = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", esc) + "$"
            self.paths.append((re.compile(rx), template, item))
        self.problems = []
        self.checked = 0

    def deref(self, node):
        while isinstance(node, dict) and "$ref" in node:
            _, node = self.resolver.resolve(node["$ref"])
        return node

    def operation(self, method, path):
        for rx, template, item in self.paths:
            if rx.match(path):
                return template, item.get(method.lower())
        return None, None

    def check(self, method, url, status, headers, body):
        path = url.split("?", 1)[0]
        template, op = self.operation(method, path)
        if op is None:
            return  # not a route of codexec's, or not this method: 404/405 are the router's
        responses = op.get("responses", {})
        if str(status) not in responses:
            self.problems.append(f"{method} {template}: status {status} is not documented")
            return
        self.checked += 1
        resp = self.deref(responses[str(status)])
        ctype = (headers.get("content-type") or "").split(";")[0].strip()
        if ctype != "application/json" or method == "HEAD":
            return
        content = resp.get("content", {})
        if "application/json" not in content:
            self.problems.append(f"{method} {template} {status}: JSON answered, none documented")
            return
        schema = content["application/json"].get("schema")
        try:
            value = json.loads(body)
        except ValueError:
            self.problems.append(f"{method} {template} {status}: the body is not JSON")
            return
        try:
            jsonschema.Draft202012Validator(schema, resolver=self.resolver).validate(value)
        except jsonschema.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            self.problems.append(f"{method} {template} {status}: at /{where}: {e.message[:300]}")


SPEC = Spec()
