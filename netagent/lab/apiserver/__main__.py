"""`python -m netagent.lab.apiserver`: how the lab and the tests run the API test server."""
import sys

from netagent.lab.apiserver.server import main

if __name__ == "__main__":
    sys.exit(main())
