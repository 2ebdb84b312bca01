"""Converters: source model + calibration data → int8 static-shape artifacts.

Heavy toolchains are imported inside a conversion only. Targets register
through the ``edge_runtime.converters`` entry-point group (see
:mod:`.registry`); :func:`.pipeline.convert` drives them.
"""
