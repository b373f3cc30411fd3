"""Unit tests of the Python guest SDK in plain CPython.

The componentize-py bindings (`wit_world`, `componentize_py_types`) are replaced by small
fakes installed before `warden_guest` is imported, so the wrappers are tested end to end:
what they send to the imports and how import errors come back. Run with
`python3 -m unittest discover -s sdk/python/tests`.
"""

import dataclasses
import enum
import json
import os
import subprocess
import sys
import types as pytypes
import unittest

SDK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _install_fake_bindings():
    """Fake `componentize_py_types` and `wit_world` with the shapes componentize-py 0.25
    generates for the `plugin` world."""
    cpt = pytypes.ModuleType("componentize_py_types")

    @dataclasses.dataclass(frozen=True)
    class Err(Exception):
        value: object

    cpt.Err = Err

    wt = pytypes.ModuleType("wit_world.imports.types")
    for case in (
        "NotFound", "InvalidInput", "Denied", "Timeout", "Remote", "Unavailable", "InputRequired", "Internal", "Canceled"
    ):
        setattr(wt, f"Error_{case}", dataclasses.make_dataclass(f"Error_{case}", [("value", str)]))
    wt.SubagentReference = dataclasses.make_dataclass("SubagentReference", ["uri", "kind", "metadata"])
    wt.SubagentDefinition = dataclasses.make_dataclass(
        "SubagentDefinition",
        ["name", "description", "kind", "reference", "tools", "permission_mode", "mcp_servers",
         "agent_mcp_servers", "egress", "protocol_data"],
    )

    http = pytypes.ModuleType("wit_world.imports.http")
    http.Request = dataclasses.make_dataclass(
        "Request", ["method", "url", "headers", "body", "timeout_ms", "auth_secret"]
    )
    http.Response = dataclasses.make_dataclass("Response", ["status", "headers", "body"])
    http.sent = []
    http.replies = []

    def send(req):
        http.sent.append(req)
        reply = http.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    http.send = send

    events = pytypes.ModuleType("wit_world.imports.events")
    events.emitted = []
    events.emit = lambda kind, data: events.emitted.append((kind, data))

    state = pytypes.ModuleType("wit_world.imports.state")
    state.store = {}
    state.get = lambda key: state.store.get(key)
    state.set = lambda key, value: state.store.__setitem__(key, value)
    state.delete = lambda key: state.store.pop(key, None)

    log = pytypes.ModuleType("wit_world.imports.log")
    log.Level = enum.Enum("Level", "TRACE DEBUG INFO WARN ERROR")
    log.lines = []
    log.denied = False

    def write(level, message):
        if log.denied:
            raise Err(wt.Error_Denied("capability `log` denied"))
        log.lines.append((level, message))

    log.write = write

    clock = pytypes.ModuleType("wit_world.imports.clock")
    clock.now = 1000
    clock.now_ms = lambda: clock.now
    clock.remaining_ms = lambda: 5000

    def sleep(ms):
        if ms >= 5000:
            raise Err(wt.Error_Timeout("a sleep would not end before the deadline"))
        clock.now += ms

    clock.sleep = sleep
    cancel = pytypes.ModuleType("wit_world.imports.cancel")
    cancel.flag = False
    cancel.is_canceled = lambda: cancel.flag
    cancel.wait = lambda ms: cancel.flag

    imports = pytypes.ModuleType("wit_world.imports")
    imports.types, imports.http, imports.events, imports.state, imports.log = wt, http, events, state, log
    imports.clock, imports.cancel = clock, cancel
    exports = pytypes.ModuleType("wit_world.exports")
    exports.Meta = type("Meta", (), {})
    exports.Resolver = type("Resolver", (), {})
    exports.Executor = type("Executor", (), {})
    world = pytypes.ModuleType("wit_world")
    world.imports, world.exports = imports, exports
    sys.modules.update({
        "componentize_py_types": cpt,
        "wit_world": world,
        "wit_world.imports": imports,
        "wit_world.exports": exports,
        "wit_world.imports.types": wt,
        "wit_world.imports.http": http,
        "wit_world.imports.events": events,
        "wit_world.imports.state": state,
        "wit_world.imports.log": log,
        "wit_world.imports.clock": clock,
        "wit_world.imports.cancel": cancel,
    })
    return cpt, imports


cpt, imports = _install_fake_bindings()
sys.path.insert(0, SDK)
import warden_guest as wg  # noqa: E402 - after the fakes


class Errors(unittest.TestCase):
    def test_each_case_maps_to_its_wit_value_and_back(self):
        for cls in (
            wg.NotFound, wg.InvalidInput, wg.Denied, wg.Timeout, wg.Remote, wg.Unavailable, wg.InputRequired,
            wg.Internal, wg.Canceled,
        ):
            wit = cls("m").to_wit()
            self.assertEqual(type(wit).__name__, f"Error_{cls._case}")
            self.assertEqual(wg.Error.from_wit(wit), cls("m"))
        self.assertEqual(str(wg.InputRequired("which branch?")), "input-required: which branch?")

    def test_context_is_added_once(self):
        self.assertEqual(wg.Denied("no").context("fetching"), wg.Denied("fetching: no"))
        self.assertEqual(wg.NotFound("a.md: gone").context("a.md").message, "a.md: gone")

    def test_common_failures_get_a_case(self):
        with self.assertRaises(json.JSONDecodeError) as caught:
            json.loads("{nope")
        self.assertIsInstance(wg.from_exception(caught.exception), wg.InvalidInput)
        self.assertIsInstance(wg.from_exception(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")), wg.InvalidInput)
        self.assertEqual(wg.from_exception(KeyError("x")), wg.Internal("KeyError: 'x'"))
        self.assertEqual(wg.from_exception(cpt.Err(imports.types.Error_Timeout("late"))), wg.Timeout("late"))

    def test_import_errors_come_back_as_sdk_errors(self):
        def refuse():
            raise cpt.Err(imports.types.Error_Denied("capability `state` denied"))

        with self.assertRaises(wg.Denied) as caught:
            wg.call(refuse)
        self.assertIn("`state`", caught.exception.message)


class MetadataGetters(unittest.TestCase):
    def setUp(self):
        self.m = wg.Metadata([("url", "  http://x "), ("blank", " "), ("n", "3"), ("bad", "x"), ("on", "Yes"), ("t", "1500ms"), ("url", "second")])

    def test_get_trims_first_value_and_blank_is_absent(self):
        self.assertEqual(self.m.get("url"), "http://x")
        self.assertEqual(self.m.raw("url"), "  http://x ")
        self.assertIsNone(self.m.get("blank"))
        self.assertEqual(self.m.get("missing", "d"), "d")

    def test_typed_getters_name_the_key(self):
        self.assertEqual(self.m.int("n"), 3)
        self.assertIs(self.m.flag("on"), True)
        self.assertEqual(self.m.duration_ms("t"), 1500)
        with self.assertRaises(wg.InvalidInput) as caught:
            self.m.int("bad")
        self.assertEqual(caught.exception.message, 'metadata `bad` "x": expected an integer')
        with self.assertRaises(wg.InvalidInput) as caught:
            self.m.require("blank")
        self.assertEqual(caught.exception.message, "metadata `blank` is required")
        for text in ("soon", "5 fortnights", "0"):
            with self.assertRaises(wg.InvalidInput):
                wg.Metadata([("timeout", text)]).duration_ms("timeout")
        self.assertEqual(wg.Metadata([("x", "2m")]).duration_ms("x"), 120_000)

    def test_of_reads_a_reference(self):
        ref = imports.types.SubagentReference("u://a", "K", [("name", "a")])
        self.assertEqual(wg.Metadata.of(ref).require("name"), "a")


class Http(unittest.TestCase):
    def setUp(self):
        imports.http.sent.clear()
        imports.http.replies.clear()

    def reply(self, status, body, headers=()):
        imports.http.replies.append(imports.http.Response(status, list(headers), body))

    def test_post_json_sends_json_and_reads_json(self):
        self.reply(200, b'{"answer": 42}')
        out = wg.http.post_json("http://h/rpc", {"q": 1}, timeout_ms=900, auth_secret="TOKEN")
        self.assertEqual(out, {"answer": 42})
        req = imports.http.sent[0]
        self.assertEqual((req.method, req.url, req.body, req.timeout_ms, req.auth_secret), ("POST", "http://h/rpc", b'{"q": 1}', 900, "TOKEN"))
        self.assertIn(("content-type", "application/json"), req.headers)

    def test_status_and_body_errors_are_remote_and_quote_the_body(self):
        self.reply(502, b"  upstream down  ")
        with self.assertRaises(wg.Remote) as caught:
            wg.http.get_json("http://h/x")
        self.assertEqual(caught.exception.message, "http://h/x returned HTTP 502: upstream down")
        self.reply(200, b"<html>oops</html>")
        with self.assertRaises(wg.Remote) as caught:
            wg.http.get_json("http://h/x")
        self.assertIn("not the expected JSON", caught.exception.message)

    def test_host_refusals_keep_their_case(self):
        imports.http.replies.append(cpt.Err(imports.types.Error_Denied("capability `http` denied")))
        with self.assertRaises(wg.Denied):
            wg.http.request("GET", "http://elsewhere/")

    def test_excerpts_and_timeouts_are_bounded(self):
        ex = wg.http.excerpt(("é" * 400).encode())
        self.assertTrue(ex.endswith("…") and len(ex.encode()) <= wg.http.EXCERPT_BYTES + 3)
        self.assertEqual(wg.http.timeout_within(30_000), 29_500)
        self.assertEqual(wg.http.timeout_within(1_000), 900)
        r = wg.http.Response(200, [("Content-Type", "text/plain")], b"hi")
        self.assertEqual((r.header("content-type"), r.text()), ("text/plain", "hi"))


class HostHelpers(unittest.TestCase):
    def test_events_are_json(self):
        wg.events.emit("progress", {"message": "turn 1"})
        self.assertEqual(imports.events.emitted[-1], ("progress", '{"message": "turn 1"}'))
        with self.assertRaises(wg.Internal):
            wg.events.emit("progress", {"x": object()})

    def test_state_round_trips_json(self):
        wg.state.set_json("k", {"turns": [1, 2]})
        self.assertEqual(wg.state.get_json("k"), {"turns": [1, 2]})
        self.assertIsNone(wg.state.get_json("absent"))
        wg.state.set("raw", b"\xff")
        with self.assertRaises(wg.Internal) as caught:
            wg.state.get_json("raw")
        self.assertIn("state `raw`", caught.exception.message)
        wg.state.delete("k")
        self.assertIsNone(wg.state.get("k"))

    def test_logging_is_best_effort(self):
        wg.log.info("hello")
        self.assertEqual(imports.log.lines[-1], (imports.log.Level.INFO, "hello"))
        imports.log.denied = True
        try:
            wg.log.warn("dropped")  # no exception
            with self.assertRaises(wg.Denied):
                wg.log.write("warn", "strict")
        finally:
            imports.log.denied = False


class Export(unittest.TestCase):
    def test_exports_delegate_and_turn_exceptions_into_wit_errors(self):
        class P(wg.Plugin):
            def info(self):
                return "info"

            def can_resolve(self, reference):
                return reference == "yes"

            def resolve(self, reference):
                raise wg.InvalidInput("field `x`")

            def execute(self, ctx, call, definition):
                return {}["missing"]

        Meta, Resolver, Executor = wg.export(P)
        self.assertTrue(issubclass(Meta, sys.modules["wit_world.exports"].Meta))
        self.assertEqual(Meta().info(), "info")
        self.assertTrue(Resolver().can_resolve("yes"))
        with self.assertRaises(cpt.Err) as caught:
            Resolver().resolve("r")
        self.assertEqual(caught.exception.value, imports.types.Error_InvalidInput("field `x`"))
        with self.assertRaises(cpt.Err) as caught:
            Executor().execute(None, None, None)
        self.assertEqual(caught.exception.value, imports.types.Error_Internal("KeyError: 'missing'"))

    def test_a_plugin_whose_constructor_raises_answers_an_error_value(self):
        class Broken(wg.Plugin):
            def __init__(self):
                raise wg.Unavailable("config missing")

        _, Resolver, Executor = wg.export(Broken)
        for run in (lambda: Resolver().resolve("r"), lambda: Executor().execute(None, None, None)):
            with self.assertRaises(cpt.Err) as caught:
                run()
            self.assertEqual(caught.exception.value, imports.types.Error_Unavailable("config missing"))


class WithoutBindings(unittest.TestCase):
    def test_pure_parts_import_and_host_helpers_say_why_they_cannot_run(self):
        code = (
            "import warden_guest as wg\n"
            "assert wg.Metadata([('a', ' 1 ')]).int('a') == 1\n"
            "try:\n    wg.state.get('k')\nexcept wg.Unavailable as e:\n    print(e.message)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], cwd=SDK, capture_output=True, text=True, check=True)
        self.assertIn("only inside a componentize-py build", out.stdout)


if __name__ == "__main__":
    unittest.main()


class ClockAndCancel(unittest.TestCase):
    def test_sleep_paces_and_a_sleep_past_the_deadline_is_a_timeout(self):
        start = wg.clock.now_ms()
        wg.clock.sleep(250)
        self.assertEqual(wg.clock.now_ms() - start, 250)
        self.assertEqual(wg.clock.remaining_ms(), 5000)
        with self.assertRaises(wg.Timeout):
            wg.clock.sleep(10_000)

    def test_cancellation_is_polled_and_awaited(self):
        self.assertFalse(wg.cancel.is_canceled())
        self.assertFalse(wg.cancel.wait(10))
        imports.cancel.flag = True
        try:
            self.assertTrue(wg.cancel.is_canceled())
            self.assertTrue(wg.cancel.wait(10))
        finally:
            imports.cancel.flag = False


class Definitions(unittest.TestCase):
    def test_typed_fields_default_to_unset_and_can_be_given(self):
        ref = imports.types.SubagentReference(uri="u", kind="K", metadata=[])
        d = wg.definition("n", "d", ref)
        self.assertEqual(
            (d.kind, d.tools, d.permission_mode, d.mcp_servers, d.agent_mcp_servers, d.egress, d.protocol_data),
            ("K", None, None, [], [], None, "{}"))
        d = wg.definition("n", "d", ref, '{"x": 1}', tools=["Read"], egress=["pypi.org"])
        self.assertEqual((d.tools, d.egress, d.protocol_data), (["Read"], ["pypi.org"], '{"x": 1}'))
        with self.assertRaises(TypeError):
            wg.definition("n", "d", ref, tools=["Read"], colour="red")
