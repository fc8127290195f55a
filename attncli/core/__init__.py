"""The computation: a validated, frozen Problem, its options, the stages and their one composition
(engine, blocked path, plan), returning a Trace. Never prints; imports nothing above it."""
