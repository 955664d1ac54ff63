import torch

from streamrft.consumers.batch import collate, micro_batches, token_logprobs
from streamrft.schemas import Trajectory


def _t(prompt, resp, lps, mask=None):
    return Trajectory(group_id="g", task_id="t", model_version=0, prompt_ids=prompt, response_ids=resp,
                      logprobs=lps, loss_mask=mask)


def test_collate_aligns_response_tokens_with_the_logits_that_predict_them():
    b = collate([(_t([1, 2, 3], [4, 5], [-0.1, -0.2]), 1.5, 1.0), (_t([6], [7, 8, 9], [-0.3, -0.4, -0.5], [1, 0, 1]), -1.5, 0.0)], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    # column t scores token t+1: row 0 response starts at token 3 -> column 2
    assert b.mask.tolist() == [[0, 0, 1, 1], [1, 0, 1, 0]]
    assert torch.allclose(b.old_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [-0.3, -0.4, -0.5, 0]]))
    assert b.advantages.tolist() == [1.5, -1.5]


def test_token_logprobs_matches_manual_log_softmax():
    torch.manual_seed(0)

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 10)

        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"logits": self.emb(input_ids)})()

    model = Toy()
    b = collate([(_t([1, 2], [3, 4], [-1.0, -1.0]), 0.0, 0.0)], pad_id=0)
    lp, ent = token_logprobs(model, b, temperature=0.5, with_entropy=True)
    logits = model.emb.weight[[1, 2, 3]] / 0.5
    expect = torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor([2, 3, 4])]
    assert torch.allclose(lp[0], expect)
    p = torch.softmax(logits, -1)
    assert torch.allclose(ent[0], -(p * p.log()).sum(-1))


def test_environment_tokens_logits_get_no_gradient_through_the_trainer_path(tmp_path):
    from streamrft.engine.algorithms import POLICY_LOSSES, policy_objective
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer("abc")
    model = build_tiny_model(tmp_path, tok, hidden_size=16, layers=1, heads=2, max_positions=32)
    seen = {}

    class Spy(torch.nn.Module):  # keeps the logits so their gradient can be read
        def forward(self, input_ids, attention_mask):
            out = model(input_ids=input_ids, attention_mask=attention_mask)
            out.logits.retain_grad()
            seen["logits"] = out.logits
            return out

    # multi-turn: model turn, environment turn (mask 0, log-prob 0.0), model turn
    batch = collate([(_t([1, 4], [5, 6, 4, 4, 6, 2], [-1.0, -1.0, 0.0, 0.0, -1.0, -1.0], [1, 1, 0, 0, 1, 1]), 1.0, 1.0),
                     (_t([1], [6, 5, 2], [-1.0, 0.0, -1.0], [1, 0, 1]), -1.0, 0.0)], pad_id=0)
    logp, _ = token_logprobs(Spy(), batch)
    loss, _ = policy_objective(logp, batch.old_logprobs, batch.advantages, batch.mask,
                               loss_fn=POLICY_LOSSES["pg"], agg_mode="token-mean")
    loss.backward()
    grad = seen["logits"].grad[:, :-1]  # column t predicts token t+1, as batch.mask
    assert batch.mask.tolist() == [[0, 1, 1, 0, 0, 1, 1], [1, 0, 1, 0, 0, 0, 0]]
    masked = grad[batch.mask == 0]
    assert torch.equal(masked, torch.zeros_like(masked))
    assert (grad[batch.mask > 0].abs().sum(-1) > 0).all()  # pg: every model token has -A * grad(logp)


def test_token_logprobs_skips_the_prompt_and_equals_the_full_computation(tmp_path):
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer("abcdef")
    model = build_tiny_model(tmp_path, tok, hidden_size=16, layers=1, heads=2, max_positions=32)
    calls = []

    class Full(torch.nn.Module):  # no logits_to_keep: every position, as before
        def forward(self, input_ids, attention_mask):
            out = model(input_ids=input_ids, attention_mask=attention_mask)
            calls.append(out.logits.shape[1])
            return out

    batch = collate([(_t([1, 4, 5, 6, 7], [5, 6, 2], [-1.0] * 3), 1.0, 1.0),
                     (_t([1, 4, 5, 6], [6, 5, 4, 2], [-1.0, 0.0, -1.0, -1.0], [1, 0, 1, 1]), -1.0, 0.0)], pad_id=0)
    first = 3  # row 1's response is predicted from column 3 on (prompt of 4 tokens)
    assert batch.mask[:, :first].sum() == 0 and batch.mask[1, first] == 1
    expect, expect_ent = token_logprobs(Full(), batch, temperature=0.7, with_entropy=True)
    assert calls == [8]
    seen = []
    orig = model.forward

    def spy(*args, **kwargs):
        out = orig(*args, **kwargs)
        seen.append(out.logits.shape[1])
        return out

    model.forward = spy
    got, got_ent = token_logprobs(model, batch, temperature=0.7, with_entropy=True)
    assert seen == [8 - first]  # logits for the last L - first positions only
    assert got.shape == expect.shape == (2, 7)
    m = batch.mask > 0
    assert torch.allclose(got[m], expect[m], atol=1e-6) and torch.allclose(got_ent[m], expect_ent[m], atol=1e-6)
    assert torch.allclose(got[:, first:], expect[:, first:], atol=1e-6)
    assert torch.equal(got[:, :first], torch.zeros(2, first))


def test_micro_batches_by_count_then_by_padded_tokens():
    assert micro_batches([5, 3, 9, 2, 7], max_seqs=2) == [[0, 1], [2, 3], [4]]
    # longest first: 9 alone (9 * 2 > 16), then 7 (7 * 2 = 14 <= 16 takes 5), then 3 with 2 (3 * 2 <= 16)
    assert micro_batches([5, 3, 9, 2, 7], max_seqs=4, max_tokens=16) == [[2], [4, 0], [1, 3]]
    assert micro_batches([5, 3, 9, 2, 7], max_seqs=2, max_tokens=100) == [[2, 4], [0, 1], [3]]
    assert micro_batches([40], max_seqs=4, max_tokens=16) == [[0]]  # too long for the budget: alone


def test_select_keeps_rows_and_cuts_the_common_padding():
    b = collate([(_t([1, 2, 3], [4, 5], [-0.1, -0.2]), 1.5, 1.0), (_t([6], [7], [-0.3]), -1.5, 0.0)], pad_id=0)
    part = b.select([1])
    assert part.input_ids.tolist() == [[6, 7]] and part.mask.tolist() == [[1.0]]
    assert part.old_logprobs.tolist() == [[-0.30000001192092896]] and part.advantages.tolist() == [-1.5]
    assert b.select([1, 0]).input_ids.tolist() == [[6, 7, 0, 0, 0], [1, 2, 3, 4, 5]]
