"""Hooks into where agents are hosted (installed as ``mtrl_integrations``)."""
