"""pe_anchors.atlas: SSDC per block of several models on the same images, equal to `measure_ssdc` on each, written as one
table and one figure; timm names are built offline (random weights) when asked."""
import pytest
import timm
import torch
from PIL import Image

import pe_anchors  # noqa: F401  (registers the pe_vit_* models)
from pe_anchors.atlas import atlas, block_ssdc
from pe_anchors.data import image_folder, stratified_sample
from pe_anchors.interventions import measure_ssdc
from pe_anchors.results import read_results


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    "An image folder of two classes, 6 + 6 images per split, 8 px, smooth gradients that differ by class."
    root = tmp_path_factory.mktemp('images')
    for split in ('train', 'val'):
        for c in range(2):
            (root / split / f'c{c}').mkdir(parents=True)
            for i in range(6):
                im = Image.new('RGB', (8, 8))
                im.putdata([((x * 30 + 10 * i) % 256, (y * 30 + 90 * c) % 256, 60) for y in range(8) for x in range(8)])
                im.save(root / split / f'c{c}' / f'{i}.png')
    return root


def test_atlas_is_measure_ssdc_of_each_model_on_the_same_images(folder, tmp_path):
    torch.manual_seed(0)
    models = {'ape': timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=2).eval(),
              'nope': timm.create_model('pe_vit_nano_patch1_8', pe='none', num_classes=2).eval()}
    df = atlas(models, folder, n_images=8, n_perms=2, out=tmp_path / 'a', show_progress=False)
    assert set(df['model']) == {'ape', 'nope'} and set(df['mode']) == {'normal', 'rpi'}
    assert sorted(p.name for p in (tmp_path / 'a').iterdir()) == ['atlas.csv', 'atlas.csv.sha256', 'atlas.png']
    assert len(read_results(tmp_path / 'a' / 'atlas.csv')) == len(df)
    # the rows of one model are measure_ssdc's on the stratified sample, normalised as the model's data config says
    m = models['ape']
    data = image_folder(folder, img_size=8, mean=m.pretrained_cfg['mean'], std=m.pretrained_cfg['std'], in_memory=True)
    x = data.normalize(data.valid.images[stratified_sample(data.valid.labels, 8, 0)])
    want = measure_ssdc(m, [x], 'rpi', 2, 0, show_progress=False).values.mean(0)
    got = df[(df.model == 'ape') & (df['mode'] == 'rpi')].sort_values('layer')['value'].to_numpy()
    assert abs(got - want).max() < 1e-6
    rows = block_ssdc(m, [x], 'normal', perm_seed=0)
    assert list(rows['depth']) == [0, 1 / 3, 2 / 3, 1] and list(rows['tap']) == [f'blocks.{i}.norm1' for i in range(4)]


def test_a_timm_name_is_built_offline_at_the_folder_size(folder):
    df = atlas(['vit_tiny_patch16_224'], folder, n_images=4, n_perms=1, pretrained=False, show_progress=False,
               model_kwargs=dict(img_size=8, patch_size=2, depth=2))
    assert set(df['model']) == {'vit_tiny_patch16_224'} and sorted(df['layer'].unique()) == [0, 1]


def _packed(folder, tmp_path):
    "The image folder packed as CIFAR-10's npz layout ({train,val}_jpeg bytes, _offsets, _labels, classes)."
    import io
    import numpy as np
    d = {}
    for split in ('train', 'val'):
        files = sorted((folder / split).glob('*/*.png'))
        ims = []
        for f in files:
            b = io.BytesIO(); Image.open(f).save(b, 'JPEG', quality=100); ims.append(b.getvalue())
        d[f'{split}_jpeg'] = np.frombuffer(b''.join(ims), np.uint8)
        d[f'{split}_offsets'] = np.cumsum([0] + [len(x) for x in ims]).astype(np.int64)
        d[f'{split}_labels'] = np.array([int(f.parent.name[1:]) for f in files])
    d['classes'] = np.array(['c0', 'c1'])
    np.savez(tmp_path / 'p.npz', **d)
    return tmp_path / 'p.npz'


def test_trained_models_are_given_by_path_and_images_as_a_packed_npz(folder, tmp_path):
    from pe_anchors.data import cifar10
    from pe_anchors.hub import save_hub
    torch.manual_seed(0)
    m = timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=2).eval()
    hub = save_hub(m, tmp_path / 'ape-hub')
    npz = _packed(folder, tmp_path)
    by_path = atlas([str(hub)], npz, n_images=8, n_perms=2, show_progress=False)
    assert set(by_path['model']) == {'ape-hub'}                          # named after the folder it was given as
    # the same numbers as the model passed built, on the npz's images normalised by the model's own statistics
    data = cifar10(npz, img_size=8)
    mean, std = m.pretrained_cfg['mean'], m.pretrained_cfg['std']
    x = ((data.valid.images[stratified_sample(data.valid.labels, 8, 0)].float() / 255
          - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None])
    want = measure_ssdc(m, [x], 'rpi', 2, 0, show_progress=False).values.mean(0)
    got = by_path[by_path['mode'] == 'rpi'].sort_values('layer')['value'].to_numpy()
    assert abs(got - want).max() < 1e-5


def test_a_cnn_is_measured_beside_a_vit_unpermuted_only(folder, tmp_path):
    torch.manual_seed(0)
    models = {'vit': timm.create_model('pe_vit_nano_patch1_8', pe='ape', num_classes=2).eval(),
              'cnn': timm.create_model('resnet10t', num_classes=2).eval()}
    df = atlas(models, folder, n_images=8, n_perms=2, out=tmp_path / 'a', show_progress=False, img_size=8)
    modes = df.groupby('model')['mode'].unique().map(sorted).to_dict()
    assert modes == {'vit': ['normal', 'rpi'], 'cnn': ['normal']}
    # the CNN's rows are block_ssdc's on the same stratified sample, at 8 px: the stem's 4x4 map pooled to the 2x2 grid
    m = models['cnn']
    data = image_folder(folder, img_size=8, mean=m.pretrained_cfg['mean'], std=m.pretrained_cfg['std'], in_memory=True)
    x = data.normalize(data.valid.images[stratified_sample(data.valid.labels, 8, 0)])
    want = block_ssdc(m, [x])
    got = df[df.model == 'cnn']
    assert list(got['tap']) == list(want['tap']) == ['act1', 'layer1'] and abs(got['value'].to_numpy() - want['value'].to_numpy()).max() < 1e-9
    assert (tmp_path / 'a' / 'atlas.png').exists()


def test_what_cannot_be_read_is_left_out_saying_why(folder):
    vit = timm.create_model('pe_vit_nano_patch1_8', pe='none', num_classes=2).eval()
    with pytest.warns(UserWarning, match='lin is not measured: not a timm model'):
        df = atlas({'vit': vit, 'lin': torch.nn.Linear(3, 2)}, folder, n_images=4, n_perms=1, show_progress=False)
    assert set(df['model']) == {'vit'}
    with pytest.warns(UserWarning), pytest.raises(ValueError, match='none of the models can be measured'):
        atlas({'lin': torch.nn.Linear(3, 2)}, folder, n_images=4, show_progress=False)


def test_coverage_table_builds_names_offline_and_the_cli_prints_it(folder, capsys):
    from pe_anchors import cli
    from pe_anchors.atlas import coverage_table
    cov = coverage_table(['resnet10t', 'vit_tiny_patch16_224', 'twins_svt_small'])
    assert list(cov.columns) == ['architecture', 'family', 'position', 'taps', 'unpermuted', 'rpi']
    rpi = cov.set_index('architecture')['rpi']
    assert rpi['vit_tiny_patch16_224'] == 'yes' and rpi['resnet10t'].startswith('a CNN: position comes only from convolutions')
    assert rpi['twins_svt_small'].startswith("position comes only from convolutions (the PEG after each stage's first block)")
    assert cli.main(['atlas', 'resnet10t', 'vit_tiny_patch16_224', '--threads', '1', '--quiet']) == 0
    out = capsys.readouterr().out
    assert 'a CNN: position comes only from convolutions' in out and '12 blocks: norm1' in out and 'give --data-path' in out
    assert cli.main(['atlas', 'resnet10t', '--random', '--data-path', str(folder), '--images', '4', '--img-size', '16',
                     '--min-stride', '0', '--out', str(folder.parent / 'cli-atlas'), '--threads', '1', '--quiet']) == 0
    rows = read_results(folder.parent / 'cli-atlas' / 'atlas.csv')
    assert list(rows['tap']) == ['act1', 'layer1', 'layer2'] and set(rows['mode']) == {'normal'}   # act1 8x8, not pooled
