# shellcheck shell=sh
# Installed as /etc/profile.d/trainer-launcher.sh (sourced, not run): login shells keep the
# image's PATH.
# Debian's /etc/profile (python:*-slim, the test base) sets PATH anew for every login shell, and
# the Kubeflow SDK's container backend runs its trainer as `bash -lc "..."`: without this file the
# torchrun shim and the launcher's venv drop off PATH and the SDK silently falls back to
# `python train.py`, one process, no torchrun. Ubuntu's /etc/profile (the PyTorch images) leaves
# PATH alone, and then this file changes nothing.
# install-launcher.sh records the image's PATH at build time in image-path beside the venv.
# When an entry of it is missing, PATH becomes that PATH, in its order, followed by what the
# profile added (sbin for root, games) that it lacks.
if [ -r /opt/trainer-launcher/image-path ]; then
  read -r _tl_image_path < /opt/trainer-launcher/image-path
  _tl_rest=$_tl_image_path
  _tl_missing=
  while [ -n "$_tl_rest" ]; do
    _tl_dir=${_tl_rest%%:*}
    case $_tl_rest in *:*) _tl_rest=${_tl_rest#*:} ;; *) _tl_rest= ;; esac
    case ":$PATH:" in *":$_tl_dir:"*) ;; *) _tl_missing=yes ;; esac
  done
  if [ -n "$_tl_missing" ]; then
    _tl_path=$_tl_image_path
    _tl_rest=$PATH
    while [ -n "$_tl_rest" ]; do
      _tl_dir=${_tl_rest%%:*}
      case $_tl_rest in *:*) _tl_rest=${_tl_rest#*:} ;; *) _tl_rest= ;; esac
      case ":$_tl_path:" in *":$_tl_dir:"*) ;; *) _tl_path=$_tl_path:$_tl_dir ;; esac
    done
    PATH=$_tl_path
    export PATH
  fi
  unset _tl_image_path _tl_rest _tl_missing _tl_dir _tl_path
fi
