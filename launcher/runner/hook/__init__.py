"""The directory put first on the ranks' PYTHONPATH when hang detection is on: it holds only the
``sitecustomize`` that registers each rank's stack dump. (A package only so that it is installed.)"""
