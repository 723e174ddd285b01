"""The training loop every engine runs (`loop`: one step of the paper's six, for n agents) and
the events it emits to its listeners (`events`)."""
