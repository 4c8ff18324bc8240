"""Packaging for pe_anchors, in the nbdev 2 form: every setting is read from settings.ini."""
from configparser import ConfigParser
import setuptools, shlex

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

expected = ('version description keywords author author_email license status min_python audience language '
            'lib_name user git_url').split()
missing = [o for o in expected if o not in cfg]
if missing: raise ValueError(f"settings.ini is missing: {', '.join(missing)}")

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature',
            '7 - Inactive']
py_versions = '3.10 3.11 3.12 3.13'.split()

lic = licenses.get(cfg['license'].lower(), (cfg['license'], None))
min_python = cfg['min_python']
requirements = shlex.split(cfg.get('requirements', ''))
dev_requirements = shlex.split(cfg.get('dev_requirements', ''))
tracking_requirements = shlex.split(cfg.get('tracking_requirements', ''))
corruptions_requirements = shlex.split(cfg.get('corruptions_requirements', ''))
console_scripts = [o.strip() for o in cfg.get('console_scripts', '').split(';') if o.strip()]

setuptools.setup(
    name=cfg['lib_name'],
    license=lic[0],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'Natural Language :: ' + cfg['language'].title(),
                 'Topic :: Scientific/Engineering :: Artificial Intelligence']
                + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]]
                + (['License :: ' + lic[1]] if lic[1] else []),
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    package_data={cfg['lib_name']: ['assets/*']},
    install_requires=requirements,
    extras_require={'dev': dev_requirements, 'tracking': tracking_requirements,
                    'corruptions': corruptions_requirements},
    dependency_links=cfg.get('dep_links', '').split(),
    python_requires='>=' + min_python,
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'console_scripts': console_scripts, 'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    **{k: cfg[k] for k in ['version', 'description', 'keywords', 'author', 'author_email']},
)
