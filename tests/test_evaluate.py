"""pe_anchors.evaluate: the rows of one model against independent measurements, the SSDC sample, each evaluation set
built once, a model of another class count refused."""
import dataclasses

import pytest
import torch

import pe_anchors  # noqa: F401
from pe_anchors.results import RESULT_COLUMNS
from pe_anchors.data import ImageSplit
from pe_anchors.evaluate import EvalData, evaluate_model
from pe_anchors.sweep import run_experiment
from pe_anchors.learner import pe_learner

from conftest import FAST, tiny_two_conditions, tiny_two_seeds


def _count_builds(monkeypatch):
    "Spy on the construction of evaluation sets: every `shifted_set` call by shift name, and every hash of a whole set."
    import pe_anchors.robustness as R
    built, hashed = [], []
    real_set, real_hash = R.shifted_set, R.set_fingerprint
    def spy_set(batches, shift, *a, **k):
        built.append('clean' if shift is None else shift.name)
        return real_set(batches, shift, *a, **k)
    def spy_hash(*a, **k):
        hashed.append(1)
        return real_hash(*a, **k)
    monkeypatch.setattr(R, 'shifted_set', spy_set); monkeypatch.setattr(R, 'set_fingerprint', spy_hash)
    return built, hashed


def test_evaluate_model_rows_match_independent_measurements(digits):
    from pe_anchors.robustness import evaluate_accuracy, make_shift, shifted_set, TensorBatches
    exp = tiny_two_conditions()
    ev = EvalData(digits, exp.ssdc_images, 64, 'cpu')
    torch.manual_seed(0)
    model = pe_learner(digits, 'ape', seed=0, show_progress=False, model_kwargs=dict(depth=2)).model.eval()
    df = evaluate_model(model, ev, exp, 'ape', seed=0)
    assert list(df.columns[:len(RESULT_COLUMNS)]) == list(RESULT_COLUMNS)
    plain = df[df['sweep'].isna()]
    clean = plain[(plain.metric == 'acc') & (plain['shift'] == 'clean')]['value'].item()
    # the accuracy row equals a direct evaluation over the whole validation split
    ref = evaluate_accuracy(model, digits.valid_uint8(bs=100, device='cpu'), digits.normalize, show=False)
    assert clean == pytest.approx(ref)
    # fragility rows are 1 - A_shift / A_clean of the accuracy rows
    for kind in ('jpeg', 'blur'):
        a = plain[(plain.metric == 'acc') & (plain['shift'] == kind)]['value'].item()
        fs = plain[(plain.metric == 'fs') & (plain['shift'] == kind)]['value'].item()
        assert fs == pytest.approx(1 - a / clean)
    # the alpha = 0 sweep point equals the same weights evaluated with the PE switched off
    sweep = df[df['sweep'] == 'alpha']
    with model.pos_embed.scaled(0.):
        ref0 = evaluate_accuracy(model, digits.valid_uint8(bs=100, device='cpu'), digits.normalize, show=False)
    got0 = sweep[(sweep.metric == 'acc') & (sweep['shift'] == 'clean') & (sweep.alpha == 0.)]['value'].item()
    assert got0 == pytest.approx(ref0)
    assert set(plain[plain.metric == 'ssdc']['layer']) == {0, 1, 2}            # two block inputs and the output tap
    # the output tap is the SSDC of what the head reads: the final norm's patch tokens, computed here without hooks
    from pe_anchors.ssdc import ssdc
    out = plain[(plain.metric == 'ssdc') & (plain['mode'] == 'normal') & (plain['tap'] == 'output')]
    assert list(out['layer']) == [2]
    with torch.no_grad(): feats = torch.cat([model.forward_features(x)[:, 1:] for x in ev.ssdc_batches])
    assert out['value'].item() == pytest.approx(float(ssdc(feats, (8, 8))), abs=1e-6)
    # the α sweep records the whole RPI curve and both fragilities at each α
    at0 = sweep[sweep.alpha == 0.]
    assert sorted(at0[at0.metric == 'ssdc']['layer']) == [0, 1, 2] and set(at0[at0.metric == 'fs']['shift']) == {'jpeg', 'blur'}


@pytest.mark.parametrize('n', [64, 100, 359])
def test_ssdc_sample_is_exact_stratified_and_shared(digits, n):
    # exactly n images, every class in proportion (digits' 360 validation images: 36 per class), whatever the eval batch
    ev = EvalData(digits, n, 48, 'cpu', sample_seed=0)
    assert ev.n_ssdc == n and sum(len(b) for b in ev.ssdc_batches) == n
    counts = torch.bincount(ev.labels[ev.ssdc_index], minlength=10)
    per_class = torch.bincount(ev.labels, minlength=10) * n / len(ev.labels)
    assert (counts - per_class).abs().max() < 1 and counts.sum() == n and (counts > 0).all()
    rec = ev.sample_record()
    assert rec['n_images'] == n and rec['per_class'] == counts.tolist() and len(rec['indices']) == n
    again = EvalData(digits, n, 100, 'cpu', sample_seed=0)                    # another batch size: the same images
    assert torch.equal(again.ssdc_index, ev.ssdc_index) and again.sample_record()['sha1'] == rec['sha1']
    assert torch.equal(torch.cat(again.ssdc_batches), torch.cat(ev.ssdc_batches))
    assert not torch.equal(EvalData(digits, n, 48, 'cpu', sample_seed=1).ssdc_index, ev.ssdc_index)


def test_each_shifted_set_is_built_once_per_experiment(tmp_path, digits, monkeypatch):
    "Two conditions, both with an α sweep: the clean set and each shift's set are built (and the set hashed) once in all."
    built, hashed = _count_builds(monkeypatch)
    exp = tiny_two_conditions(conditions=['ape', 'spe'], alpha_conditions=['ape', 'spe'], untrained=False, alphas=[1., .5])
    df = run_experiment(exp, tmp_path / 'exp', device='cpu', show=False, data=digits)
    assert sorted(built) == ['blur/paper', 'clean', 'jpeg/paper'], built        # not once per model, nor per α
    assert len(hashed) == 1                                                      # the set's fingerprint: once
    assert sorted(p.name.split('__')[1] for p in (tmp_path / 'exp' / 'cache').glob('*.safetensors')) == \
           ['blur-paper', 'jpeg-paper']                                          # the disk cache holds the shifted sets
    alpha = df[(df['sweep'] == 'alpha') & (df.metric == 'acc') & (df['shift'] == 'jpeg')]
    assert len(alpha) == 4 and alpha['value'].notna().all()                      # 2 conditions x 2 α on the same JPEG set
    # a second process over the same directory reads the shifted sets back from the disk cache: no shift runs again
    import pe_anchors.robustness as R
    ran = []
    monkeypatch.setattr(R.JPEG, 'apply', lambda self, x, offset: ran.append(len(x)) or R.jpeg_roundtrip(x, self.quality))
    run_experiment(tiny_two_conditions(conditions=['ape', 'spe', 'nope'], alpha_conditions=['ape', 'spe'], untrained=False,
                        alphas=[1., .5]), tmp_path / 'exp', device='cpu', show=False, data=digits)
    assert [n for n in ran if n > 1] == []     # no set shifted again (one blank image is shifted by the fit check, sweep._check_shifts)


def test_an_analysis_builds_each_set_once(digits, monkeypatch):
    "`analyze` (EvalData + evaluate_model, no disk cache) with an α sweep: JPEG is computed once for the plain and the α rows."
    built, hashed = _count_builds(monkeypatch)
    exp = tiny_two_conditions(conditions=['ape'], alpha_conditions=['ape'], alphas=[1., .5, 0.])
    ev = EvalData(digits, exp.ssdc_images, 64, 'cpu')
    model = pe_learner(digits, 'ape', seed=0, show_progress=False, model_kwargs=dict(depth=2)).model
    evaluate_model(model, ev, exp, 'ape', seed=0)
    evaluate_model(model, ev, exp, 'ape', seed=1)                                # a second model on the same EvalData
    assert sorted(built) == ['blur/paper', 'clean', 'jpeg/paper'] and hashed == []


def test_a_model_of_another_class_count_is_refused(small):
    two = dataclasses.replace(small, classes=['0', '1'],
                              train=ImageSplit(small.train.labels[small.train.labels < 2], images=small.train.images[small.train.labels < 2]),
                              valid=ImageSplit(small.valid.labels[small.valid.labels < 2], images=small.valid.images[small.valid.labels < 2]))
    model = pe_learner(small, 'ape', **FAST).model                             # 10 classes
    ev = EvalData(two, 8, 32, 'cpu')
    with pytest.raises(ValueError, match=r'10 classes.*2 classes'): evaluate_model(model, ev, tiny_two_seeds(), 'ape')
