"""Files written whole, folder checks (files.py) and progress bars (progress.py): used by every
package above kernels/, importing none of them."""
