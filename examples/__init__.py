"""Sample cases for the core and recorded teacher outputs for the demo, as package data
(`verdict.examples`). No code lives here."""
