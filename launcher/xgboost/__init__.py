"""XGBoost: ``trainer-launcher xgboost`` runs a program with the DMLC_* env Trainer's XGBoost policy injects."""
