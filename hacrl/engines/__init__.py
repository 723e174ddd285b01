"""Engines: adapters that run one agent's model behind `hacrl.engines.base.Engine`."""
