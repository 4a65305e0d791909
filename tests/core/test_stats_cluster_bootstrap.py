"""The paired cluster bootstrap (``stats.cluster_bootstrap``): estimates are the plain quantiles, a
constant shift between arms gives a zero-width difference interval, clustered data give wider
intervals than token resampling, and bad inputs are named."""
import numpy as np
import pytest

from sparrow_server.stats.cluster_bootstrap import paired_cluster_quantiles
from sparrow_server.stats.tail import bootstrap_quantile_ci


def _clustered(n_clusters=30, per=200, seed=0):
    rng = np.random.default_rng(seed)
    level = rng.uniform(0.5, 0.95, n_clusters)  # each prompt has its own acceptance level
    values = np.clip(np.repeat(level, per) + rng.normal(0, 0.03, n_clusters * per), 0, 1)
    return values, np.repeat(np.arange(n_clusters), per)


def test_estimates_and_a_constant_shift():
    values, clusters = _clustered()
    out = paired_cluster_quantiles({"a": values + 0.02, "b": values}, clusters, pairs=[("a", "b")], n_boot=300)
    assert out.arms["b"].estimate == pytest.approx(np.quantile(values, 0.05))
    assert out.arms["b"].low <= out.arms["b"].estimate <= out.arms["b"].high
    diff = out.diffs[("a", "b")]
    assert diff.estimate == pytest.approx(0.02) and diff.low == pytest.approx(0.02) and diff.high == pytest.approx(0.02)
    assert (out.n_tokens, out.n_clusters) == (6000, 30)
    assert out.to_dict()["diffs"]["a - b"]["estimate"] == pytest.approx(0.02)


def test_clusters_widen_the_interval_over_token_resampling():
    values, clusters = _clustered()
    by_cluster = paired_cluster_quantiles({"a": values}, clusters, n_boot=400).arms["a"]
    low, high = bootstrap_quantile_ci(values, n_boot=400)
    assert by_cluster.high - by_cluster.low > 2 * (high - low)


def test_deterministic_for_a_seed():
    values, clusters = _clustered()
    a = paired_cluster_quantiles({"a": values}, clusters, n_boot=50, seed=3)
    b = paired_cluster_quantiles({"a": values}, clusters, n_boot=50, seed=3)
    assert a == b


@pytest.mark.parametrize("kwargs, match", [
    (dict(values={}), "values: no arms"),
    (dict(values={"a": np.zeros(3)}, clusters=np.zeros(4)), r"values\['a'\]"),
    (dict(values={"a": np.zeros(0)}, clusters=np.zeros(0)), "clusters: empty"),
    (dict(pairs=[("a", "z")]), "pairs: 'z'"),
    (dict(q=1.5), "q = 1.5"),
    (dict(n_boot=0), "n_boot = 0"),
])
def test_errors_name_the_argument(kwargs, match):
    args = dict(values={"a": np.ones(4)}, clusters=np.arange(4))
    with pytest.raises(ValueError, match=match):
        paired_cluster_quantiles(**{**args, **kwargs})
