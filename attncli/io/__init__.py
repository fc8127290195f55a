"""Reading inputs (arrays, problem files, checkpoints and their layouts) and writing outputs atomically.
Above core (it builds Problems), below check, render and cli."""
