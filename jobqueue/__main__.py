from jobqueue.ops.cli import main

main()
