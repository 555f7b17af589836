"""A vendor kernel module that ends the process when its library is absent (``sys.exit`` at import)."""
import sys

sys.exit("libacme_kernels.so not found")
