"""Kernels that only training graphs use: backward ops, losses, optimizer updates, dropout.

Backward kernels take the forward tensors they need as inputs (x, y, the output gradient)
and read shapes from them when the graph is planned, so a backward graph works for any
batch size, like its forward graph. Update kernels write into their variable inputs in
place and produce no outputs; they are marked `foldable = False` so the planner never
evaluates them at plan time.
"""
