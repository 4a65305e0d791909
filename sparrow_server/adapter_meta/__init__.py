"""What an adapter is and what it was trained on: the artifact's metadata (``metadata``) and the
base-model fingerprint (``fingerprint``, needs torch). A low package: the engine (which serves
adapters) and ``distill`` (which writes them) both import it, neither imports the other."""
