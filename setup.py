"""Packaging for sparse_attention_repro; every field is read from settings.ini (nbdev 2 layout)."""
from configparser import ConfigParser
import setuptools, shlex

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

cfg_keys = 'version description keywords'.split()
expected = cfg_keys + "lib_name branch license status min_python audience language".split()
for o in expected: assert o in cfg, "missing expected setting: {}".format(o)
setup_cfg = {o: cfg[o] for o in cfg_keys + ['author', 'author_email', 'git_url'] if cfg.get(o)}   # unknown fields stay out
if 'git_url' in setup_cfg: setup_cfg['url'] = setup_cfg.pop('git_url')

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive']
py_versions = '3.10 3.11 3.12'.split()

requirements = shlex.split(cfg.get('requirements', ''))
dev_requirements = shlex.split(cfg.get('dev_requirements', ''))
extras = {k[len('extras_'):]: shlex.split(v) for k, v in cfg.items() if k.startswith('extras_')}
min_python = cfg['min_python']
lic = licenses.get(cfg['license'].lower(), (cfg['license'], None))

# The experiment notebooks ship inside the package, so a regular (non-editable) install can run the grids from anywhere:
# the build copies nbs/experiments/*.ipynb to sparse_attention_repro/experiments/ (git-ignored; the nbs/ copies are the source).
import shutil, pathlib
_src, _dst = pathlib.Path('nbs/experiments'), pathlib.Path(cfg['lib_path']) / 'experiments'
if _src.is_dir():
    _dst.mkdir(exist_ok=True)
    for _nb in _src.glob('*.ipynb'): shutil.copyfile(_nb, _dst / _nb.name)
if pathlib.Path('nbs/csrc').is_dir():                     # the C kernels' sources, read by kernels.kernel_folder()
    shutil.copytree('nbs/csrc', pathlib.Path(cfg['lib_path']) / 'csrc', dirs_exist_ok=True)

setuptools.setup(
    name=cfg['lib_name'],
    license=lic[0],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'Natural Language :: ' + cfg['language'].title()]
                + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]]
                + (['License :: ' + lic[1]] if lic[1] else []),
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    package_data={cfg['lib_name']: ['experiments/*.ipynb', 'csrc/*.c', 'csrc/*.h']},
    install_requires=requirements,
    extras_require={'dev': dev_requirements, **extras, 'all': sorted({r for v in extras.values() for r in v})},
    dependency_links=cfg.get('dep_links', '').split(),
    python_requires='>=' + cfg['min_python'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'console_scripts': cfg.get('console_scripts', '').split(), 'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d']},
    **setup_cfg)
