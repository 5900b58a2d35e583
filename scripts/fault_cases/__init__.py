"""The cases of scripts/faults.py, by what each exercises (issue 81: the script was 949 lines in one file)."""
