"""sockherd.ipc: framed messages and fd passing over socketpairs, listener
inheritance formats, control protocol."""
