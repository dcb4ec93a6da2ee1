"""docs/openapi.yaml describes every route the router knows, and nothing
it doesn't. (Every answer the other system tests get is checked against its
schemas: tests/system/openapi_check.py, reported by tests/run.py.)"""

import os
import re

import openapi_check
from harness import eq

ROUTER = os.path.join(os.path.dirname(__file__), "..", "..", "fcgi", "router.c")


def router_routes():
    with open(ROUTER) as f:
        text = f.read()
    routes = set()
    for method, pattern in re.findall(r'\{"(GET|POST|DELETE|PUT|PATCH)", "(/[^"]*)"', text):
        routes.add((method, pattern))
        if method == "GET":
            routes.add(("HEAD", pattern))  # the router answers HEAD for every GET
    return routes


def spec_routes(doc):
    out = set()
    for template, item in doc["paths"].items():
        rest = template.endswith("/{path}")  # a workspace path: the router's "{**}"
        pattern = re.sub(r"\{[^}]+\}", "{}", template[:-7] if rest else template)
        pattern += "/{**}" if rest else ""
        for method in ("get", "head", "post", "delete", "put", "patch"):
            if method in item:
                out.add((method.upper(), pattern))
    return out


def test_every_route_is_documented(ctx):
    routes, doc = router_routes(), openapi_check.SPEC.doc
    documented = spec_routes(doc)
    # HEAD, which the router answers for every GET, is documented where a
    # client uses it: downloads and files
    wanted = {r for r in routes if r[0] != "HEAD"} | {("HEAD", "/v1/artifacts/{}/content"),
                                                      ("HEAD", "/v1/conversations/{}/files/{**}")}
    eq(sorted(wanted - documented), [], "routes the document lacks")
    eq(sorted(documented - routes), [], "documented routes the router does not know")
    eq(doc["openapi"], "3.1.0", "OpenAPI 3.1")


def test_every_operation_documents_its_errors(ctx):
    for template, item in openapi_check.SPEC.doc["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            codes = set(op["responses"])
            if op.get("security", [None]) != []:
                eq("401" in codes, True, f"{method.upper()} {template} documents 401")
            eq(any(c.startswith("2") or c == "304" for c in codes), True,
               f"{method.upper()} {template} documents its success")
