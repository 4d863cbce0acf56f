"""Global-norm gradient clipping: on one process the same as torch's clip_grad_norm_."""

import pytest
import torch

from ddl.contract.grad_norm import clip_grad_norm

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("max_norm", [0.05, 1e6])  # clipping, and a limit never reached
def test_one_process_matches_torch(max_norm):
    torch.manual_seed(0)
    mine, theirs = (torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
                    for _ in range(2))
    theirs.load_state_dict(mine.state_dict())
    inputs = torch.randn(4, 8)
    for model in (mine, theirs):
        model(inputs).square().sum().backward()
    got = clip_grad_norm(mine.parameters(), max_norm)
    want = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    assert got == pytest.approx(float(want), rel=1e-6)
    for a, b in zip(mine.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    if max_norm < 1:
        assert float(clip_grad_norm(mine.parameters(), 1e6)) == pytest.approx(max_norm, 1e-4)
