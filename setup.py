"""The package's one compiled module, built when a C compiler is at hand: ``protocol/_frames`` writes a small
message's WebSocket frame in one call. It is optional: without a compiler the install goes on and
:mod:`plugrl_env_client.protocol.frame_packer` writes the same bytes in Python."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("plugrl_env_client.protocol._frames", ["src/plugrl_env_client/protocol/_frames.c"],
                             optional=True)])
