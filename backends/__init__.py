"""Built-in hardware backends (``dsahal.backends.<vendor>``), each a plugin of the
``dsahal.backends`` entry-point group exactly as a vendor's package would be, plus kernels
shared between them. Nothing here is imported by the core."""
