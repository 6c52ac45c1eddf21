"""Persistent homology (docs/geometry.md section 6) on circles, tori and noise; needs the geometry extra."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drmlab.geometry.topology import (
    betti_at,
    bootstrap_persistence,
    have_gudhi,
    landmarks,
    long_bars,
    persistence,
)

pytestmark = pytest.mark.skipif(not have_gudhi(), reason="gudhi is not installed (pip install 'drmlab[geometry]')")


def circle(n=120, radius=1.0, noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 2 * math.pi, n)
    return radius * np.stack([np.cos(t), np.sin(t)], 1) + noise * rng.standard_normal((n, 2))


def torus(n=3000, big=3.0, small=1.0, seed=0):
    """Points of the torus of revolution in R^3, uniform in the two angles."""
    rng = np.random.default_rng(seed)
    u, v = rng.uniform(0, 2 * math.pi, (2, n))
    return np.stack(
        [(big + small * np.cos(v)) * np.cos(u), (big + small * np.cos(v)) * np.sin(u), small * np.sin(v)], 1
    )


def test_a_sampled_circle_has_one_long_h1_bar_dying_at_the_closed_form_scale():
    diagrams = persistence(circle(), max_dim=1)
    bars = long_bars(diagrams[1], 0.5)
    assert len(bars) == 1
    # the Rips complex of the circle of radius 1 fills in at the chord of an inscribed triangle, sqrt(3)
    assert abs(bars[0, 1] - math.sqrt(3)) < 0.08
    assert betti_at(diagrams, 0.5) == {0: 1, 1: 1}


def test_a_torus_has_two_h1_bars_and_one_h2_bar():
    diagrams = persistence(torus(), max_dim=2, method="alpha")
    assert betti_at(diagrams, 0.3) == {0: 1, 1: 2, 2: 1}
    # closed-form deaths (alpha radii): the tube's loop at its radius 1, the central hole at 3 - 1 = 2,
    # the enclosed void when the tube fills, at 1
    h1 = np.sort(long_bars(diagrams[1], 0.3)[:, 1])
    assert np.abs(h1 - [1.0, 2.0]).max() < 0.01
    assert abs(long_bars(diagrams[2], 0.3)[0, 1] - 1.0) < 0.01


def test_noise_has_no_bar_beyond_the_threshold():
    rng = np.random.default_rng(1)
    diagrams = persistence(rng.uniform(0, 1, (150, 3)), max_dim=1)
    assert betti_at(diagrams, 0.2)[1] == 0  # no loop beyond a fifth of the cube's side (largest seen: 0.16)
    assert betti_at(diagrams, 0.35)[0] == 1  # and one component beyond the nearest-neighbour scale


def test_landmarks_keep_the_circle_and_the_bootstrap_spread_is_small():
    points = circle(n=2000, noise=0.01)
    idx = landmarks(points, 100)
    assert len(set(idx.tolist())) == 100
    assert betti_at(persistence(points[idx], max_dim=1), 0.5)[1] == 1
    spread = bootstrap_persistence(points[idx], resamples=5, fraction=0.8)
    assert spread[1]["mean"][0] > 1.2 and spread[1]["std"][0] < 0.1
    assert spread[1]["mean"][1] < 0.3  # the second H1 bar is noise
