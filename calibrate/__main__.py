try:
    from calibrate.cli import main
except KeyboardInterrupt:  # Ctrl-C while the first modules load: no traceback
    raise SystemExit(130) from None

raise SystemExit(main())
