"""POST /v1/score and /v1/rerank (vLLM's and Jina's shapes, api/score_api) on one `loom serve`
with one CPU worker running the default model: a pair's score is the cosine similarity of the two
texts' embeddings, the same numbers POST /v1/embeddings gives; one text against many or two lists
of one length; rerank ranks documents best first with top_n and return_documents; what the
endpoints refuse is a 400 naming the parameter (404 for another model).
"""
import numpy as np
import pytest
import requests

QUERY = "Where is the Eiffel Tower?"
DOCUMENTS = ["The Eiffel Tower is in Paris.", "Bananas are yellow.", "Paris is the capital of France.",
             "def fibonacci(n): return n"]


def post(rig, path, body):
    return requests.post(rig.coordinator.http_url + path, json=body, timeout=120)


def embeddings(client, model, texts):
    return [np.array(item.embedding, dtype=np.float64)
            for item in client.embeddings.create(model=model, input=texts).data]


def test_scores_are_the_cosines_of_the_embeddings(rig, client, model):
    vectors = embeddings(client, model, [QUERY] + DOCUMENTS)
    one_to_many = post(rig, "/v1/score", {"model": model, "text_1": QUERY, "text_2": DOCUMENTS})
    assert one_to_many.status_code == 200, one_to_many.text
    body = one_to_many.json()
    assert body["object"] == "list" and body["model"] == model
    assert [item["index"] for item in body["data"]] == list(range(len(DOCUMENTS)))
    for item, vector in zip(body["data"], vectors[1:]):
        assert item["object"] == "score"
        assert abs(item["score"] - float(vectors[0] @ vector)) < 1e-6
    # Pairs of two lists, in order; a text scored against itself is 1.
    pairs = post(rig, "/score", {"model": model, "text_1": [QUERY, DOCUMENTS[1]],
                                 "text_2": [DOCUMENTS[0], DOCUMENTS[1]]}).json()
    assert abs(pairs["data"][0]["score"] - body["data"][0]["score"]) < 1e-9
    assert abs(pairs["data"][1]["score"] - 1.0) < 1e-6
    assert pairs["usage"]["prompt_tokens"] > 0


def test_rerank_ranks_documents_best_first(rig, client, model):
    vectors = embeddings(client, model, [QUERY] + DOCUMENTS)
    cosines = [float(vectors[0] @ v) for v in vectors[1:]]
    answer = post(rig, "/v1/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == sorted(range(len(DOCUMENTS)), key=lambda d: -cosines[d])
    for result in results:
        assert abs(result["relevance_score"] - cosines[result["index"]]) < 1e-6
        assert result["document"]["text"] == DOCUMENTS[result["index"]]
    top = post(rig, "/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS, "top_n": 2,
                                "return_documents": False}).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]]
    assert all("document" not in r for r in top)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/score", {"text_2": "a"}, "text_1"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/v1/score", {"text_1": "a", "text_2": []}, "text_2"),
    ("/v1/score", {"text_1": "", "text_2": "a"}, "text_1"),
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": "a"}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a", 3]}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
])
def test_bad_requests_are_400_naming_the_parameter(rig, model, path, body, param):
    answer = post(rig, path, {"model": model, **body})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text


def test_another_model_is_404(rig):
    assert post(rig, "/v1/score", {"model": "nope", "text_1": "a", "text_2": "b"}).status_code == 404
    assert post(rig, "/v1/rerank", {"model": "nope", "query": "a", "documents": ["b"]}).status_code == 404


def test_an_input_too_long_is_named_by_its_place_in_the_request(rig, model):
    # The embedder numbers the texts it places (the query first); the error names them as the
    # request does.
    long = "word " * 20000
    answer = post(rig, "/v1/rerank", {"model": model, "query": "q", "documents": ["a", long]})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith("documents[1]: "), answer.text
    answer = post(rig, "/v1/rerank", {"model": model, "query": long, "documents": ["a"]})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith("query: "), answer.text
    answer = post(rig, "/v1/score", {"model": model, "text_1": ["a", "b"], "text_2": ["c", long]})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith("text_2[1]: "), answer.text
