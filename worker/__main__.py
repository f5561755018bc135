from sockherd.worker.bootstrap import main

raise SystemExit(main())
