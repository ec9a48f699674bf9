from calibrate.cli import main

raise SystemExit(main())
