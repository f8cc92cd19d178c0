"""The command line's library side: every flag known, --help, flag spelling, a job's log file."""
