#!/bin/sh
# Slim the image's venv (deploy/Containerfile runs this in its build stage): remove what the
# agent never imports, compile every module once so containers start without writing
# bytecode, then check that the agent and the client parts it uses still import.
#   pip, setuptools, pkg_resources, _distutils_hack   only installers use them
#   bin/pip*, bin/activate*                            no shell enters the venv
#   kubernetes/aio and the packages only it imports    the asyncio client (68 MB + aiohttp's
#     (aiohttp and its dependencies)                   17 MB); netagent uses the synchronous one
#   */tests, */test directories, kubernetes' *_test.py packages' own test suites
#   the source of kubernetes/client/api and models     generated code (33 MB of .py): only its
#                                                      bytecode is kept, beside where the source
#                                                      was, so tracebacks there show no lines
# The bytecode is checked by hash, not by timestamp, so copying the tree keeps it valid.
#
#     deploy/prune-venv.sh /opt/netagent/venv
set -eu
venv=$1
site=$(echo "$venv"/lib/python3*/site-packages)
[ -d "$site" ] || { echo "prune-venv.sh: no site-packages under $venv" >&2; exit 1; }
python=$venv/bin/python3

rm -rf "$venv"/bin/pip "$venv"/bin/pip3* "$venv"/bin/activate* "$venv"/bin/Activate.ps1
cd "$site"
for package in pip setuptools pkg_resources _distutils_hack \
               aiohttp aiohttp_retry aiohappyeyeballs aiosignal frozenlist multidict propcache yarl attr attrs; do
  rm -rf "./$package" ./"$package"-*.dist-info
done
rm -rf ./distutils-precedence.pth ./kubernetes/aio
find . -mindepth 2 -type d \( -name tests -o -name test \) -prune -exec rm -rf {} +
find ./kubernetes -name '*_test.py' -delete
find . -name __pycache__ -type d -prune -exec rm -rf {} +

# Sourceless: kubernetes/client/api/x.pyc beside where x.py was (legacy layout, -b).
"$python" -m compileall -q -j 0 -b --invalidation-mode unchecked-hash kubernetes/client/api kubernetes/client/models
find kubernetes/client/api kubernetes/client/models -name '*.py' -delete
"$python" -m compileall -q -j 0 --invalidation-mode unchecked-hash .

"$python" -c "import netagent.cli, netagent.daemon.run, netagent.kube.config, kubernetes.client, kubernetes.config"
