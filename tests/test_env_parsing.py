from hypothesis import given, settings, strategies as st

from jaxrag.env.parsing import canon, find_marker, find_tag, json_field, loads_lenient


def test_loads_lenient_variants():
    want = {"predicted_answer": "Paris", "generated_query": "None"}
    for s in ['{"predicted_answer": "Paris", "generated_query": "None"}',
              '```json\n{"predicted_answer": "Paris", "generated_query": "None",}\n```',
              "{'predicted_answer': 'Paris', 'generated_query': 'None'}",
              '“predicted_answer”: x {“predicted_answer”: “Paris”, “generated_query”: “None”,}',
              'text {"predicted_answer": "Paris", "generated_query": "None"',
              '{"a": 1} then {"predicted_answer": "Paris",\n "generated_query": "None",\n}',
              '{"predicted_answer": "Paris", // the capital\n "generated_query": "None" // no query\n}']:
        assert loads_lenient(s) == want, s
    assert loads_lenient("{'x': None, 'y': true}") == {"x": None, "y": True}
    assert loads_lenient('{"url": "http://x.org/a // b"}') == {"url": "http://x.org/a // b"}   # inside a string
    assert loads_lenient('```json\n{"0": "```"}\n```') == {"0": "```"}   # a fence inside a string is text
    assert loads_lenient('text {"a": "b",\n```') == {"a": "b"}              # unclosed, a fence after it
    assert loads_lenient("no json here") is None
    assert loads_lenient("{broken: [}") is None


def test_json_field_fallback():
    assert json_field('"generated_query": "who is  X", "predicted', "generated_query") == "who is X"
    assert json_field("'generated_query': None", "generated_query") == "None"
    assert json_field("nothing", "generated_query") is None


def test_find_tag_variants():
    assert find_tag("a <query> x  y </query> b <query>z</query>", "query") == "z"
    assert find_tag("a <query> x  y </query> b <query>z</query>", "query", last=False) == "x y"
    assert find_tag("So the next query is <Query>who is X", "query") == "who is X"
    assert find_tag("<query>a<evidence>b", "query") == "a"
    assert find_tag("< answer >ok</ answer >", "answer") == "ok"
    assert find_tag("none", "answer") is None


def test_find_marker_markdown():
    assert find_marker("think\n**Query:** who is x\n", ("query", "answer")) == ("query", "who is x")
    assert find_marker("### Answer: Paris", ("query", "answer")) == ("answer", "Paris")
    assert find_marker("Query: a\nAnswer: b", ("query", "answer")) == ("answer", "b")
    assert find_marker("Answer:", ("answer",)) is None


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parsers_never_raise(s):
    loads_lenient(s)
    json_field(s, "generated_query")
    find_tag(s, "answer")
    find_marker(s, ("query", "answer"))
    assert canon(s) == canon(canon(s))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), st.one_of(st.text(max_size=20), st.integers(), st.none()),
                       max_size=4))
def test_loads_lenient_reads_json_dumps_with_noise(d):
    import json
    s = "reasoning...\n```json\n" + json.dumps(d, indent=2) + "\n```"
    got = loads_lenient(s)
    assert got == d or (d == {} and got == {})
